"""dist-check: the Python README's plain example, run from an installed package.

The example is the first ```python block of the README that travels in the
distribution's metadata (its long description), run as written in an empty
directory; then its results are checked.
"""

import contextlib
import io
import os
import re
import sys
import tempfile
from importlib import metadata

import idempotency_ledger

venv = sys.prefix
assert idempotency_ledger.__file__.startswith(venv), f"imported from {idempotency_ledger.__file__}, not from {venv}"
dist = metadata.distribution("idempotency-ledger")
readme = dist.metadata.get_payload()
example = re.findall(r"```python\n(.*?)```", readme, re.S)[0]

namespace: dict = {}
out = io.StringIO()
with tempfile.TemporaryDirectory(prefix="idempotency-ledger-smoke-") as workdir, contextlib.chdir(workdir):
    with contextlib.redirect_stdout(out):
        exec(compile(example, "README (plain Python)", "exec"), namespace)
    first, retry = namespace["first"], namespace["retry"]
    namespace["ledger"].close()
print(f"python ({os.path.basename(venv)}): idempotency-ledger {dist.version} from {os.path.dirname(idempotency_ledger.__file__)};"
      f" the README example printed: {out.getvalue().strip()}")
assert out.getvalue() == "executed replayed 201 b'{\"order\":\"o_1\"}'\n", out.getvalue()
assert (first.outcome, retry.outcome) == ("executed", "replayed")  # the WIT outcome names, as strings
assert (first.status, first.body) == (retry.status, retry.body) == (201, b'{"order":"o_1"}')
