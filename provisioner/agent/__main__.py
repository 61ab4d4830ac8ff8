import sys

from provisioner.cli import main

sys.exit(main(["agent", *sys.argv[1:]]))
