"""The examples of README.md and docs/, copied out of the documents and run as a user would.

They run one after another in one Python process (``ExampleRunner``), as scripts a user runs
with ``python``: each makes its session with ``getOrCreate()`` and so finds the one before it,
where a process of its own would start Spark again.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration_tests.conftest import S3Service
from integration_tests.example_runner import ExampleRunner
from twophase import cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-a-sink.md"


def exampleCode(index: int) -> str:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) == 4, (
        f"{DOC} should hold four python examples (one class; two halves; its contract test, "
        "run by tests/test_testing_contract.py; its error, run by tests/test_cli_errors.py)"
    )
    return blocks[index]


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleRunner]:
    runner = ExampleRunner(tmp_path_factory.mktemp("examples"))
    yield runner
    runner.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("example", [0, 1], ids=["one-class", "writer-and-committer"])
def test_the_documented_sink_runs_and_commits_every_row_once(
    tmp_path: Path, example: int, examples: ExampleRunner
) -> None:
    script = tmp_path / "jsonl_sink.py"
    script.write_text(exampleCode(example))
    # docs/writing-a-sink.md says to run the first example twice: the second run resumes
    # from the checkpoint and adds nothing. The second example is the same sink split in two.
    for _ in range(2 - example):
        lines = examples.run(script, [str(tmp_path / "run")], {}, timeout=240)
        assert "2000 rows committed" in lines, lines
    ids = [
        json.loads(line)["id"]
        for path in sorted((tmp_path / "run" / "data").glob("batch=*/*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert sorted(ids) == list(range(2000))
    assert not list((tmp_path / "run" / "data" / "_pending").iterdir())


@pytest.mark.timeout(300)
def test_the_readme_pipelines_print_every_row_once(tmp_path: Path, examples: ExampleRunner) -> None:
    """Both README examples (format(), and foreachBatch over 200 partitions), in one process."""
    readme = (DOC.parents[1] / "README.md").read_text()
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
        if "twophase.register(spark)" in b
    ]
    assert len(blocks) == 2, "README.md lost one of its two runnable examples"
    code = "\n".join(blocks)
    for name in ("twophase-out", "twophase-ckpt", "twophase-wide-ckpt", "twophase-wide"):
        code = code.replace(f'"/tmp/{name}"', f'"{tmp_path / name}"')
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    lines = examples.run(script, [], {}, timeout=240)
    assert lines[-2:] == ["100000", "100000"], lines
    wide = sorted((tmp_path / "twophase-wide").glob("*.parquet"))
    assert len(wide) == 2 * 10, f"one file per task and batch, not per partition: {len(wide)}"


def runDocExample(
    examples: ExampleRunner, doc: str, tmp_path: Path, code: str | None = None, **env: str
) -> list[str]:
    """Run the one python block of ``docs/<doc>`` (or ``code`` made from it) against
    ``tmp_path/work``, with ``env`` added; it must succeed. Its output lines."""
    if code is None:
        code = docExample(doc)
    script = tmp_path / f"{Path(doc).stem}_example.py"
    script.write_text(code)
    return examples.run(script, [str(tmp_path / "work")], env, timeout=240)


def docExample(doc: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (DOC.parent / doc).read_text(), re.DOTALL)
    assert len(blocks) == 1, f"docs/{doc} should hold one runnable example"
    return blocks[0]


@pytest.mark.timeout(300)
def test_the_multi_example_writes_every_order_to_postgres_and_kafka_once(
    tmp_path: Path, pg_url: str, kafka_bootstrap: str, examples: ExampleRunner
) -> None:
    suffix = os.urandom(4).hex()
    code = docExample("multi.md").replace('"order-events"', f'"order-events-{suffix}"')
    code = code.replace('"orders.table", "orders"', f'"orders.table", "orders_{suffix}"')
    code = code.replace("FROM orders", f"FROM orders_{suffix}")
    lines = runDocExample(
        examples,
        "multi.md",
        tmp_path,
        code,
        TWOPHASE_PG_URL=pg_url,
        TWOPHASE_KAFKA_BOOTSTRAP=kafka_bootstrap,
    )
    assert lines[-2:] == ["orders: 10000", "events: 10000"], lines


def test_the_iceberg_example_appends_one_snapshot_per_batch(
    tmp_path: Path, examples: ExampleRunner
) -> None:
    for _ in range(2):  # docs/iceberg.md: run it again and it prints the same
        lines = runDocExample(examples, "iceberg.md", tmp_path)
        assert lines[-2:] == ["rows: 10000", "snapshots: 4"], lines
    work = tmp_path / "work"
    verify = ["verify", "--source", "sequence", "--end", "10000", "--sink", "iceberg"]
    catalog = [
        f"catalog.uri=sqlite:///{work}/catalog.db",
        f"catalog.warehouse=file://{work}/warehouse",
        "catalog.type=sql",
        "table=analytics.events",
    ]
    options = [arg for option in catalog for arg in ("--sink-option", option)]
    assert cli.main([*verify, *options]) == 0, "as docs/iceberg.md says"


@pytest.mark.timeout(300)
def test_the_lakehouse_example_writes_kafka_delta_and_iceberg_in_one_decision(
    tmp_path: Path, kafka_bootstrap: str, examples: ExampleRunner
) -> None:
    topic = f"sales-events-{os.urandom(4).hex()}"
    code = docExample("lakehouse.md").replace('"sales-events"', f'"{topic}"')
    lines = runDocExample(
        examples, "lakehouse.md", tmp_path, code, TWOPHASE_KAFKA_BOOTSTRAP=kafka_bootstrap
    )
    assert lines[-3:] == ["events: 10000", "ledger: 10000", "facts: 10000"], lines


@pytest.mark.timeout(300)
def test_the_s3_example_writes_every_row_once(
    tmp_path: Path, s3: S3Service, examples: ExampleRunner
) -> None:
    prefix = f"docs-{os.urandom(4).hex()}"
    code = docExample("files.md").replace('f"s3://{bucket}/events"', f'f"s3://{{bucket}}/{prefix}"')
    code = code.replace('f"{bucket}/events"', f'f"{{bucket}}/{prefix}"')
    assert prefix in code, "the example's output path changed: update this test"
    lines = runDocExample(
        examples,
        "files.md",
        tmp_path,
        code,
        TWOPHASE_S3_ENDPOINT=s3.endpoint,
        TWOPHASE_S3_ACCESS_KEY=s3.accessKey,
        TWOPHASE_S3_SECRET_KEY=s3.secretKey,
        TWOPHASE_S3_BUCKET=s3.bucket,
    )
    assert lines[-1] == "rows: 10000", lines


@pytest.mark.timeout(300)
def test_the_delta_example_commits_each_batch_once(tmp_path: Path, examples: ExampleRunner) -> None:
    for _ in range(2):  # docs/delta.md: run it again and it prints the same
        lines = runDocExample(examples, "delta.md", tmp_path)
        assert lines[-2:] == ["rows: 10000", "versions: 4"], lines
    table = str(tmp_path / "work" / "events")
    verify = ["verify", "--source", "sequence", "--end", "10000", "--sink", "delta"]
    assert cli.main([*verify, "--sink-option", f"path={table}"]) == 0, "as docs/delta.md says"


@pytest.mark.timeout(300)
def test_the_restarts_example_stops_its_query_cleanly(
    tmp_path: Path, examples: ExampleRunner
) -> None:
    lines = runDocExample(examples, "restarts.md", tmp_path)
    assert lines[-2:] == ["stopped cleanly: True", "restarts: 0"], lines
    assert cli.main(["status", "--checkpoint", str(tmp_path / "work" / "checkpoint")]) == 0
