import sys

from stableguards.cli import main

sys.exit(main())
