"""``python -m firstpass.calibration ...``"""

import sys

from firstpass.calibration.cli import main

sys.exit(main())
