"""The Compute Engine instance the gce backend asks for, for one pool VM.

The pool decides the VM's shape: machine type, GPUs, the boot disk (type, size, image) and its
scheduling. GPUs cannot live-migrate, so a VM with GPUs stops for host maintenance
(onHostMaintenance TERMINATE, as Compute Engine requires) and is not restarted by Compute
(automaticRestart false): a VM that went through maintenance has lost its session's processes,
and the cluster must see it ended rather than find it running again. A Spot pool's VMs, and
the VMs its Spot tier asks for, are Spot (provisioningModel SPOT) and are stopped, not deleted,
when preempted, so the cluster reads why it ended. An instance template, when configured, supplies the rest (network, tags, ...);
what is set here overrides it.
"""

from __future__ import annotations

from importlib import resources

from google.cloud import compute_v1

from provisioner.cloud.base import LABEL_REQUEST, CloudVm, LaunchSpec
from provisioner.config import BackendConfig, PoolConfig

NOTEBOOK_PORT = 8888
STATUS = {"PROVISIONING": "provisioning", "STAGING": "provisioning", "RUNNING": "running",
          "STOPPING": "stopping", "SUSPENDING": "stopping", "REPAIRING": "provisioning",
          "TERMINATED": "terminated", "STOPPED": "terminated", "SUSPENDED": "terminated"}
IMAGES_KEY = "provisioner-images"
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"
AGENT_PACKAGE_KEY = "provisioner-agent-package"
STARTUP_SCRIPT_KEY = "startup-script"
# Deep Learning VM images install the NVIDIA driver on first boot when this is TRUE.
DRIVER_KEY = "install-nvidia-driver"


def startup_script() -> str:
    return resources.files("provisioner.cloud").joinpath("startup-script.sh").read_text()


def metadata_items(spec: LaunchSpec, config: BackendConfig) -> list[compute_v1.Items]:
    items = {IMAGES_KEY: ",".join(spec.images), GUEST_ATTRIBUTES_KEY: "TRUE",
             STARTUP_SCRIPT_KEY: startup_script(), AGENT_PACKAGE_KEY: config.agent_package or "",
             DRIVER_KEY: "TRUE" if config.install_gpu_driver else "FALSE"}
    return [compute_v1.Items(key=k, value=v) for k, v in items.items()]


def scheduling(pool: PoolConfig, spot: bool = False) -> compute_v1.Scheduling:
    """`spot`: this VM is Spot (its pool's Spot tier), as every VM of a Spot pool is."""
    s = compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False)
    if pool.spot or spot:
        s.provisioning_model = "SPOT"
        s.instance_termination_action = "STOP"
    return s


def instance_for(spec: LaunchSpec, pool: PoolConfig, config: BackendConfig, labels: dict[str, str]
                 ) -> compute_v1.Instance:
    z = spec.zone
    instance = compute_v1.Instance(
        name=spec.vm_id, labels=labels, metadata=compute_v1.Metadata(items=metadata_items(spec, config)),
        machine_type=f"zones/{z}/machineTypes/{spec.machine_type}",
        guest_accelerators=[compute_v1.AcceleratorConfig(
            accelerator_type=f"zones/{z}/acceleratorTypes/{spec.accelerator}",
            accelerator_count=spec.accelerator_count)],
        scheduling=scheduling(pool, spec.spot),
        disks=[compute_v1.AttachedDisk(boot=True, auto_delete=True, initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=config.boot_image, disk_size_gb=int(pool.disk_cache_gb),
            disk_type=f"zones/{z}/diskTypes/{pool.boot_disk_type}"))],
        service_accounts=[compute_v1.ServiceAccount(email=config.service_account, scopes=list(config.scopes))])
    if not config.instance_template:  # a template's own network stays
        nic = compute_v1.NetworkInterface(network=config.network)
        if config.subnetwork:
            nic.subnetwork = config.subnetwork
        instance.network_interfaces = [nic]
    return instance


def notebook_endpoint(vm_endpoint: str, answer: str) -> str:
    """The VM's endpoint with the host port the agent's start answered (`ok <host port>`)."""
    port = answer.removeprefix("ok").strip() or str(NOTEBOOK_PORT)
    return f"{vm_endpoint.rsplit(':', 1)[0]}:{port}" if vm_endpoint else ""


def endpoint_of(inst: compute_v1.Instance) -> str:
    """Where the notebook on the VM is reached: its internal address, once it has one."""
    ip = inst.network_interfaces[0].network_i_p if inst.network_interfaces else ""
    return f"http://{ip}:{NOTEBOOK_PORT}" if ip else ""


def vm_of(inst: compute_v1.Instance, zone: str) -> CloudVm:
    # Our id is in the request label (a GKE node's instance name is GKE's own).
    vm_id = inst.labels.get(LABEL_REQUEST) or inst.name
    return CloudVm(vm_id, zone, STATUS.get(inst.status, "provisioning"), dict(inst.labels),  # type: ignore[arg-type]
                   endpoint_of(inst), inst.scheduling.provisioning_model == "SPOT")
