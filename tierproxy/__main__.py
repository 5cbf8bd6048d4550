import sys

from tierproxy.cli import main

sys.exit(main())
