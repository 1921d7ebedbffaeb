"""`python3 -m ember`: the command line (see ember.cli)."""
import sys

from ember.cli import main

sys.exit(main(sys.argv[1:]))
