"""Generated from protos/provisioner/v1 by `python -m provisioner.v1.protogen`; do not edit."""
