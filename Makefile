# Developer and CI entry points. Needs Python 3.11+ and Java 17+ (plus Maven, Go for the S3
# server, and for PostgreSQL and MariaDB the OS packages, which services/postgres.sh and
# services/mariadb.sh install with apt-get as root).
#
#   make test           unit + integration tests against the real servers below
#   make test-windows   the per-sink crash-window tests the chaos bounded profile also covers
#   make test-compat    the compatibility suite under PySpark 3.5, 4.0, 4.1, 4.2 and 4.3
#   make unit           unit tests only (no services)
#   make demo           the end-to-end demo
#   make services       start PostgreSQL, Kafka, MariaDB, S3 and a schema registry, write .services.env
#   make services-down  stop them and delete their state
#   make compose-up     the same servers and a Spark cluster under docker compose (compose-down)
#   make lint           ruff format check, ruff lint, mypy
#   make chaos KILLS=200 FAULTS=200  the random chaos soak: kills, and faults beyond kills
#                       (CLUSTER=1: on the compose cluster, with the faults of its nodes)
#                         (starts and stops the servers itself)

PYTHON ?= python3
VENV := .venv
VENV_PY := $(abspath $(VENV)/bin/python)
# Installed once per pyproject.toml change.
STAMP := $(VENV)/.installed

# Downloads (Kafka jars) and the servers' state live here.
export TWOPHASE_CACHE ?= $(HOME)/.cache/twophase
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# Spark's Python workers must use the venv's interpreter.
export PYSPARK_PYTHON := $(VENV_PY)

.PHONY: .venv demo test unit lint services services-down services-status

.venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

demo: .venv
	$(VENV)/bin/twophase demo

unit: .venv
	$(VENV)/bin/pytest tests

# $(call with_services,COMMAND[,SETS]): start the servers (services/services.sh; SETS, default
# 1, lists the sets of servers to start, TWOPHASE_SERVICES_SET), run COMMAND with the first
# set's addresses, stop them all whatever happens (also on Ctrl-C), and exit with COMMAND's
# status. Variables in .services.env win over stale ones in the environment.
define with_services
	@rc=0; sets="$(or $(2),1)"; \
	trap 'for n in $$sets; do TWOPHASE_SERVICES_SET=$$n services/services.sh down || true; done' EXIT; \
	trap 'exit 130' INT TERM; \
	for n in $$sets; do TWOPHASE_SERVICES_SET=$$n PYTHON=$(VENV_PY) services/services.sh up || exit $$?; done; \
	set -a; . ./.services.env; set +a; \
	$(1) || rc=$$?; \
	exit $$rc
endef

# `make test` runs the suite in TEST_WORKERS pytest-xdist workers, a test file to a worker, each
# worker on a set of servers of its own (worker gw<n> on set n+1, integration_tests/conftest.py):
# a test that kills, freezes or cuts off a server reaches only its own worker's tests, and no
# test sees another's tables, topics or prepared transactions. Most tests leave a core idle
# much of the time (a Spark start, a wait for a server); two workers fill it. Workers take the
# files in collection order, the longest first (integration_tests/conftest.py LONGEST_FIRST).
# The compatibility runs then go side by side (COMPAT_PARALLEL=1). A worker that crashes is
# not replaced (--max-worker-restart=0): the suite ends red at once, naming the test it crashed
# in, where a replacement would find no servers of its own (its number names a set nobody
# started) and pytest-xdist's file scheduling can wait forever for it.
TEST_WORKERS ?= 2

# The whole suite on .venv's PySpark (the newest), then the compatibility suite on the oldest
# PySpark of each way of writing: foreachBatch on 3.5, format() on 4.0 (its row-based stream
# writer), with files, Kafka and PostgreSQL; `make test-compat` runs both ways on all five, with
# every built-in sink. Spark's JVMs in the tests map their classes from an archive made once per
# PySpark (integration_tests/jvm_archive.py); the short compatibility run uses one when cached.
COMPAT_OLDEST ?= 3.5.9 4.0.5:format
test: .venv
	$(call with_services,$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0 --no-loadscope-reorder --durations=25 -m "not windows and not compat and not cluster" tests integration_tests && COMPAT_SINKS=core COMPAT_PARALLEL=1 TWOPHASE_JVM_ARCHIVE=existing PYTHON=$(PYTHON) integration_tests/compat.sh $(COMPAT_OLDEST),$(shell seq 1 $(TEST_WORKERS)))

# The per-sink crash-window tests under Spark that the chaos bounded profile of `make test`
# also fires (pytest marker `windows`): each window one by one, with the state checked after it.
.PHONY: test-windows
test-windows: .venv
	$(call with_services,$(VENV)/bin/pytest -m windows integration_tests)

# The compatibility suite (pytest marker `compat`: integration_tests/test_compat.py, and the
# version module's unit tests) under each PySpark twophase supports: one venv per version, cached
# in $(TWOPHASE_CACHE)/compat/ (PySpark installed first, then twophase; the build fails if that
# changed the PySpark), plus .venv for the newest (`current`). Servers as for `make test`.
# COMPAT_PYSPARK="4.0.5 current" runs a subset; integration_tests/compat.sh runs it against the
# servers of `make services`.
export COMPAT_PYSPARK ?= 3.5.9 4.0.5 4.1.4 4.2.1 current
.PHONY: test-compat
test-compat: .venv
	$(call with_services,PYTHON=$(PYTHON) integration_tests/compat.sh)

# The chaos soak: KILLS kills and FAULTS faults beyond kills (a frozen server, a partition, a
# slow link, lost replies, a full disk, the broker gone past the transaction timeout) over every
# pipeline, seeded (SEED=<n> replays a schedule); prints the tables and writes
# chaos-runs/report.{md,json}. Servers as for `make test`. PARALLEL=<n> runs n pipelines side by
# side on the same servers (a long soak in less time; each also meets its neighbours' faults).
# CLUSTER=1 runs it on the compose cluster instead (`make compose-up`; brought up when it is
# not): drivers in containers, the checkpoint on S3, and the faults of nodes (a worker lost,
# frozen or cut off, the driver lost, a second driver on the same checkpoint).
KILLS ?= 200
FAULTS ?= 0
SEED ?=
PARALLEL ?= 1
CLUSTER ?=
CHAOS_ARGS = --kills $(KILLS) --faults $(FAULTS) $(if $(SEED),--seed $(SEED)) --parallel $(PARALLEL)
.PHONY: chaos
chaos: .venv
ifeq ($(CLUSTER),1)
	docker/compose.sh up
	set -a; . services/docker.env; set +a; $(VENV)/bin/python -m integration_tests.chaos --cluster $(CHAOS_ARGS)
else
	$(call with_services,$(VENV)/bin/python -m integration_tests.chaos $(CHAOS_ARGS))
endif

services: .venv
	PYTHON=$(VENV_PY) services/services.sh up

services-down:
	services/services.sh down

services-status:
	services/services.sh status

# The same servers and a Spark standalone cluster (a master, two workers) under docker compose,
# every image built here from docker/ on a Debian base (docs/deploying.md). Installs and starts
# the Docker engine when it is missing (root on Debian).
.PHONY: compose-up compose-down compose-build
compose-up:
	docker/compose.sh up

compose-down:
	docker/compose.sh down

compose-build:
	docker/compose.sh build

# The tests against the compose cluster (marker `cluster`): docs/deploying.md's pipeline, and
# the cluster's bounded chaos profile (integration_tests/chaos/test_cluster_chaos.py: the faults
# of nodes). Brings the cluster up when it is not, and leaves it running (`make compose-down`).
.PHONY: test-cluster
test-cluster: .venv
	docker/compose.sh up
	set -a; . services/docker.env; set +a; $(VENV)/bin/pytest -m cluster integration_tests

lint: .venv
	$(VENV)/bin/ruff format --check . && $(VENV)/bin/ruff check . && $(VENV)/bin/mypy

# The sinks' option tables in docs/, written from their declarations (tests/test_option_tables.py
# fails when a table and its declaration differ).
.PHONY: docs-options
docs-options: .venv
	$(VENV)/bin/python tests/test_option_tables.py --write

# The postgres sink against Spark's JDBC writer and raw COPY (after `make services`).
.PHONY: bench-postgres
bench-postgres: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.postgres

# The twophase.kafka sink and source against Spark's own Kafka connector and a raw
# confluent-kafka producer, plus the driver commit time per batch (after `make services`).
.PHONY: bench-kafka
bench-kafka: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.kafka

# twophase.kafka's Avro against serializing in a pandas UDF before Spark's Kafka sink (after `make services`).
.PHONY: bench-kafka-avro
bench-kafka-avro: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.kafka_avro $(KAFKA_AVRO_ARGS)

# twophase.multi (PostgreSQL + Kafka in one query) against the two sinks as separate queries and
# Spark's noop sink (after `make services`); see docs/multi.md.
.PHONY: bench-multi
bench-multi: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.multi

# How long a SIGKILLed query's open transactions stall read_committed readers, for each
# transaction timeout (after `make services`); see docs/kafka.md, "Choosing the timeout".
.PHONY: bench-kafka-stall
bench-kafka-stall: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.kafka_stall

# The highest input rate Kafka -> Kafka holds for 5 minutes at p95 <= 2 s (1 s trigger), the
# twophase.kafka source and sink against Spark's own, and the broker-side markers (after `make
# services`); KAFKA_SUSTAINED_ARGS="--seconds 60 --rates 2000" for a short run.
.PHONY: bench-kafka-sustained
bench-kafka-sustained: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.kafka_sustained \
		$(KAFKA_SUSTAINED_ARGS)

# twophase.files on S3 (multipart upload) against Spark's Parquet sink on s3a (hadoop-aws by
# Maven coordinates) and Spark's noop sink, on the S3 server of `make services`; docs/files.md.
.PHONY: bench-s3
bench-s3: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.s3 $(S3_BENCH_ARGS)

# twophase.sql into MariaDB (XA) against Spark's JDBC writer in foreachBatch (MariaDB
# Connector/J by Maven coordinates), raw pymysql and Spark's noop sink, at 8 and 200
# partitions (after `make services`); see docs/sql.md.
.PHONY: bench-sql
bench-sql: .venv
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.sql $(SQL_BENCH_ARGS)


# Every sink side by side in one run: twophase vs Spark's own vs PyFlink exactly-once vs the raw
# client for files, PostgreSQL and Kafka, plus commit time, latency, memory and a sweep (after
# `make services`; PyFlink and its connector jars are cached in $(TWOPHASE_CACHE)). Writes
# bench/results/bench.{md,csv,png}; see docs/performance.md. BENCH_ARGS=--quick: a small run.
# Ends with bench-metrics (METRICS_ARGS), what the metrics cost a batch.
.PHONY: bench
bench: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.bench --sweep $(BENCH_ARGS)
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.shapes $(SHAPES_ARGS)
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.multi
	$(VENV)/bin/python -m bench.delta $(DELTA_ARGS)
	$(VENV)/bin/python -m bench.iceberg $(ICEBERG_ARGS)
	$(VENV)/bin/python -m bench.metrics $(METRICS_ARGS)

# What twophase.attachMetrics (listener, log line, Prometheus endpoint) costs a batch of
# twophase.files: alternating rounds with and without it in one run, the ratio of their median
# batch times (local disk only, no services); bench/results/metrics.md. METRICS_ARGS=--quick:
# a small run.
.PHONY: bench-metrics
bench-metrics: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	$(VENV)/bin/python -m bench.metrics $(METRICS_ARGS)

# Seconds per micro-batch of every sink against Spark's own path and Spark's noop sink, with a
# JVM source (rate-micro-batch) at 8 and 200 partitions and the Python source at 200
# (after `make services`); bench/results/shapes.md. See docs/performance.md.
.PHONY: bench-shapes
bench-shapes: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.shapes $(SHAPES_ARGS)

# Each sink's foreachBatch against PySpark's floor in alternated rounds (the floor, then the
# targets, reversed every other round): median ratio, spread, and CPU per micro-batch of the
# JVM, the Python workers and the target's server; bench/results/rounds.{md,csv}. Targets: files,
# Kafka, PostgreSQL, MariaDB, S3, Delta and Iceberg (for the last two, Spark's own path is the
# append users write in foreachBatch, delta-rs and pyiceberg).
# ROUNDS_ARGS="--spark" adds Spark's own path, default and coalesced alike; "--bare" the rows
# written by the Python client alone (no twophase); "--targets sql --rounds 6".
.PHONY: bench-rounds
bench-rounds: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.rounds $(ROUNDS_ARGS)

# twophase.delta against write_deltalake in foreachBatch (at least once), Spark's Parquet sink
# and Spark's noop sink, at 8 and 200 partitions of a JVM source and 200 of the Python source,
# plus the Delta log's growth under one commit per batch (local disk only, no services);
# bench/results/delta.md. DELTA_ARGS=--quick: a small run. See docs/delta.md.
.PHONY: bench-delta
bench-delta: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	$(VENV)/bin/python -m bench.delta $(DELTA_ARGS)

# twophase.iceberg against pyiceberg's table.append in foreachBatch (at least once), Spark's
# Parquet sink and Spark's noop sink, at 8 and 200 partitions of a JVM source and 200 of the
# Python source, plus the table's metadata growth under one snapshot per batch, before and after
# snapshot expiry (SQL catalog on SQLite, local disk only, no services);
# bench/results/iceberg.md. ICEBERG_ARGS=--quick: a small run. See docs/iceberg.md.
.PHONY: bench-iceberg
bench-iceberg: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	$(VENV)/bin/python -m bench.iceberg $(ICEBERG_ARGS)

# Where each twophase sink's time goes: wall and CPU by role against Spark's noop sink, a Python
# sink that drops its input and Spark's own path, then py-spy over the Python workers;
# bench/results/profile.md. See docs/performance.md.
.PHONY: bench-profile
bench-profile: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.breakdown $(PROFILE_ARGS)

# What PySpark charges each Python task of a 200-task micro-batch, from Spark's own Python
# runner (boot, init, rows per task), worker reuse on and off; bench/results/floor.md.
.PHONY: bench-floor
bench-floor: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	$(VENV)/bin/python -m bench.floor $(FLOOR_ARGS)

# End-to-end latency by trigger (0.1, 1, 10 s) for Kafka, files and PostgreSQL: twophase's two
# paths against Spark's own sink, read by a reader of committed data (after `make services`),
# and each path's micro-batch split by phase against the floors of PySpark's two Python paths;
# bench/results/latency.md. LATENCY_ARGS=--load 1: the same beside a busy process;
# LATENCY_ARGS="--triggers 0 --targets kafka --rates 2000,20000,50000 --rounds 2": the cost of
# a batch at a 0 s trigger, as docs/performance.md quotes it.
.PHONY: bench-latency
bench-latency: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.latency $(LATENCY_ARGS)

# Memory over time: RSS, open files and threads of the Python driver, the JVM and the Python
# workers every SOAK_EVERY of SOAK_BATCHES micro-batches per sink (SOAK_SINKS), growth from batch
# 100 to the end against 10%; then one 1,000,000-row batch in one task, its worker's peak RSS
# against the batch's Arrow size (after `make services`); bench/results/soak-memory.json. See
# docs/performance.md.
SOAK_BATCHES ?= 1000
SOAK_EVERY ?= 50
SOAK_SINKS ?= kafka,postgres,files,multi
.PHONY: soak-memory
soak-memory: .venv
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	set -a; . ./.services.env; set +a; $(VENV)/bin/python -m bench.soak_memory --sinks $(SOAK_SINKS) --batches $(SOAK_BATCHES) --every $(SOAK_EVERY) --big-batch $(SOAK_ARGS)
