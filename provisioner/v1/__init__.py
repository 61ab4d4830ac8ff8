"""Generated from protos/provisioner/v1 by `python -m provisioner.protogen`; do not edit."""
