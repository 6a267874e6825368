"""Print the commands of the README's Quick start block (the first ```bash block under "## Quick start"),
one a line, for .ci/run to run as written: comments dropped, the CPU-torch line left out (CI installs the
CPU wheel it has on disk)."""
import re
import sys
from pathlib import Path

readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
block = re.search(r"^## Quick start\n.*?```bash\n(.*?)```", readme, re.S | re.M)
if block is None:
    sys.exit("README.md has no ```bash block under '## Quick start'")
for line in block.group(1).splitlines():
    command = line.split("  #")[0].strip()
    if command and not command.startswith("#") and not command.startswith("pip install torch "):
        print(command)
