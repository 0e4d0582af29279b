import sys

from gpulint.cli import main

sys.exit(main())
