"""The file to hand `spark-submit`: `tierproxy tier` on any Spark master.

    spark-submit --master spark://HOST:7077 tierproxy/submit.py --config tierproxy.properties [--every 30s]

The master given to spark-submit wins over `spark.master` in the file (see spark.py).
"""

import os
import sys

# spark-submit puts this file's folder first on sys.path, where pipeline/copy.py would
# shadow the standard library's `copy`; the package is imported by name instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from tierproxy.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["tier", *sys.argv[1:]]))
