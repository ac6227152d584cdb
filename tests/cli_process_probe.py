"""What a child forked by `cli_process` sees (run by tests/test_cli_process.py)."""

import json
import os
import sys

print(json.dumps({"cwd": os.getcwd(), "pid": os.getpid(), "probe": os.environ.get("PROBE"),
                  "argv": sys.argv[1:], "main": __name__}))  # fmt: skip
print("to stderr", file=sys.stderr)
sys.exit(3)
