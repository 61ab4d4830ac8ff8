#!/bin/bash
# The `startup-script` the gce backend gives every VM it creates (Compute Engine runs it as root
# on every boot). It installs what the boot image lacks, once: docker, the NVIDIA driver (Google's
# installer), the NVIDIA container toolkit, and the agent (the pip requirement, wheel URL or gs://
# wheel in the `provisioner-agent-package` metadata item); then it starts the agent. On a boot
# image that has all of them (docs/google-cloud.md: building one) it only starts the agent.
set -euo pipefail
attr() {
    curl -sf -H 'Metadata-Flavor: Google' \
        "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1" || true
}
apt_install() {
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -yq "$@"
}

if ! command -v docker >/dev/null; then
    apt_install docker.io
fi
if ! command -v nvidia-smi >/dev/null; then
    # May reboot the VM to load the driver: this script runs again after it and goes on.
    curl -sfL -o /opt/cuda_installer.pyz \
        https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/cuda_installer.pyz
    python3 /opt/cuda_installer.pyz install_driver
fi
if ! command -v nvidia-ctk >/dev/null; then
    curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey |
        gpg --batch --yes --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list |
        sed 's#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#' \
        > /etc/apt/sources.list.d/nvidia-container-toolkit.list
    apt_install nvidia-container-toolkit
    nvidia-ctk runtime configure --runtime=docker
    systemctl restart docker
fi
if [ ! -x /opt/provisioner/bin/provisioner ]; then
    package="$(attr provisioner-agent-package)"
    if [ -z "$package" ] || [ "$package" = preinstalled ]; then
        echo "provisioner: no agent in this image and no provisioner-agent-package to install" >&2
        exit 1
    fi
    extras=""
    case "$package" in
        *\[*\]) extras="[${package##*\[}"; package="${package%\[*}" ;;  # e.g. a wheel's [server]
    esac
    case "$package" in
        gs://*) gcloud storage cp "$package" /opt/ && package="/opt/$(basename "$package")" ;;
    esac
    package="$package$extras"
    command -v python3 >/dev/null && python3 -m venv --help >/dev/null || apt_install python3-venv
    python3 -m venv /opt/provisioner
    /opt/provisioner/bin/pip install -q "$package"
fi
if [ ! -f /etc/systemd/system/provisioner-agent.service ]; then
    cat > /etc/systemd/system/provisioner-agent.service <<'UNIT'
[Unit]
Description=provisioner agent: image pulls, wipes and health reports for the cluster provisioner
Wants=network-online.target
After=network-online.target containerd.service docker.service nvidia-persistenced.service

[Service]
ExecStart=/opt/provisioner/bin/provisioner agent --config /etc/provisioner-agent.yaml
Restart=always
RestartSec=2
StateDirectory=provisioner-agent

[Install]
WantedBy=multi-user.target
UNIT
fi
if [ ! -f /etc/provisioner-agent.yaml ]; then
    echo '{}' > /etc/provisioner-agent.yaml  # every setting at its default
fi
systemctl daemon-reload
systemctl enable --now provisioner-agent.service
