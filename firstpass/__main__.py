import sys

from firstpass.cli import main

sys.exit(main())
