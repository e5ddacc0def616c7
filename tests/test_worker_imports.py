"""What a Spark Python worker pays to import a sink: never pandas.

PySpark imports the module of a pickled data source in each new Python worker (the planner,
the commit runner, every task's worker), so a sink that pulls in pandas at import adds that
import to the first batch of every worker. pyarrow imports pandas the first time a value is
converted from Python (``pa.scalar``, ``pa.array``), so module-level Arrow constants do it too.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SINKS = (
    "twophase.sinks.kafka",
    "twophase.sinks.files",
    "twophase.sinks.postgres",
    "twophase.sinks.sql",
    "twophase.sinks.delta",
    "twophase.sinks.iceberg",
    "twophase.sinks.multi",
)


@pytest.mark.parametrize("module", SINKS)
def test_importing_a_sink_and_the_binding_does_not_import_pandas(module: str) -> None:
    code = (
        "import sys\n"
        f"import twophase, twophase.spark.datasource, {module}\n"
        "print('pandas' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "False", f"importing {module} imported pandas"
