"""The front's certificate can name the addresses its clients dial (an internal load balancer's DNS
name or IP address), and clients can check another name than the host they dial (--server-name)."""

from __future__ import annotations

import asyncio
import ipaddress

from cryptography import x509

from conftest import fleet_config
from provisioner import cli
from provisioner import client as api
from provisioner.client.credentials import local_ca
from provisioner.cli.serve import tls_leaves


def _names(pem: bytes) -> set[str]:
    san = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*san.get_values_for_type(x509.DNSName), *map(str, san.get_values_for_type(x509.IPAddress))}


def test_certificates_add_the_front_names_given(tmp_path, capsys):
    argv = ["certificates", "--out", str(tmp_path / "pki"), "--front-name", "10.128.0.5",
            "--front-name", "front.ilb.example"]
    assert cli.main(argv) == 0
    names = _names((tmp_path / "pki" / "front.pem").read_bytes())
    assert {"front.provisioner.internal", "front.ilb.example", "10.128.0.5", "127.0.0.1"} <= names
    ip = x509.load_pem_x509_certificate((tmp_path / "pki" / "front.pem").read_bytes()).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("10.128.0.5") in ip  # an IP entry, as a client dialling the address checks
    assert "10.128.0.5" not in _names((tmp_path / "pki" / "cluster-us-central1.pem").read_bytes())
    assert "front.ilb.example" in capsys.readouterr().out


def test_the_fleet_config_names_more_front_names(tmp_path):
    fleet = fleet_config(tmp_path)
    security = fleet.settings.security.model_copy(update={"front_tls_extra_names": ("front.ilb.example",)})
    fleet = fleet.model_copy(update={"settings": fleet.settings.model_copy(update={"security": security})})
    assert tls_leaves(fleet)["front"] == ["front.provisioner.internal", "front.ilb.example"]


async def test_clients_check_the_server_name_given(local_fleet, capsys):
    where = ["--front", local_fleet.front_address, "--data-dir", str(local_fleet.data_dir)]
    assert await asyncio.to_thread(cli.main, ["admin", "clusters", "--server-name", "wrong.example", *where]) == 1
    assert "certificate was refused" in capsys.readouterr().err
    assert await asyncio.to_thread(cli.main, ["admin", "clusters", "--server-name", "front.provisioner.internal",
                                              *where]) == 0
    capsys.readouterr()
    async with api.AsyncClient(local_fleet.front_address, token=local_fleet.token("local-operator"),
                               ca=local_ca(local_fleet.data_dir), server_name="front.provisioner.internal") as c:
        assert await c.get_quota("ada")
