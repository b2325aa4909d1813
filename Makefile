# Two commands matter: `make run` and `make test`. Both create .venv and install on first use,
# and skip installing later unless pyproject.toml or this Makefile changed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PARLAI := parlai==1.7.2
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (a whole test file per worker); 0 runs in this process
TEST_WORKERS ?= 2

.PHONY: install run chat train train-shipped test test-all lint format i18n-extract i18n-update bench bench-quick bench-variants bench-loop bench-peer bench-quality bench-modelserver soak scaleout clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,ray]'
	@# ParlAI's declared pins (torchtext, numpy~=1.23, ...) cannot be resolved on a current
	@# stack; its real runtime dependencies are declared in pyproject.toml instead.
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(PARLAI)
	@touch $(STAMP)

install: $(STAMP)

run: install
	$(PY) -m bot run

chat: install
	$(PY) -m bot chat

train: install
	$(PY) -m bot train

# Reproduce the shipped default model (models/chitchat/): stage 1 for 100 minutes, stage 2 (the
# persona fine-tune) for 45, then its recipe files. Stage 2 alone on a stage-1 model:
# python -m bot train --ship --from-stage1 MODEL --out FILE; stage 1 alone: --stage1-only
train-shipped: install
	$(PY) -m bot train --ship

lint: install
	$(PY) -m ruff check bot tests bench migrations
	$(PY) -m ruff format --check bot tests bench migrations
	$(PY) -m mypy bot

format: install
	$(PY) -m ruff check --fix bot tests bench migrations
	$(PY) -m ruff format bot tests bench migrations

# Translations (docs/configuration.md, "Adding a language"): the code's sentences into
# bot/texts/locale/messages.pot, then into every language's .po (new ones empty, changed ones
# fuzzy). The service reads the .po files at start; there is nothing to compile.
i18n-extract: install
	$(PY) -m bot.texts.catalogs extract

i18n-update: i18n-extract
	$(PY) -m bot.texts.catalogs update

test: install lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Slow tests too (soak-like end-to-end runs); not part of `make test`.
test-all: install
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

bench: install
	$(PY) -m bench.memory --sessions 10000
	$(PY) -m bench.rehydrate
	$(PY) -m bench.throughput --users 1,4,8,16,32,64
	$(PY) -m bench.e2e --users 50 --messages 5
	$(PY) -m bench.variants
	$(PY) -m bench.sharing
	$(PY) -m bench.safety
	$(PY) -m bench.dashboard

bench-quick: install
	$(PY) -m bench.memory --quick
	$(PY) -m bench.rehydrate --quick
	$(PY) -m bench.throughput --quick
	$(PY) -m bench.e2e --quick
	$(PY) -m bench.sharing --quick
	$(PY) -m bench.safety --quick
	$(PY) -m bench.dashboard --quick

# Variants side by side: interference between worker processes, service overhead inline vs process.
bench-variants: install
	$(PY) -m bench.variants

# The learning loop: simulated users vote, export, fine-tune a candidate, compare it with the
# control on new users (~20 minutes on 2 cores; BENCH_LOOP_ARGS=--quick for a few minutes).
BENCH_LOOP_ARGS ?=
bench-loop: install
	nice -n 10 $(PY) -m bench.loop $(BENCH_LOOP_ARGS)

# Our generation side by side with HF transformers and CTranslate2 fp32/int8 on one model
# (bench/peer.py; installs the `peer` extra once). ~15 minutes on 2 cores; BENCH_PEER_ARGS=--quick
# for a few.
PEER_STAMP := $(VENV)/.peer-installed
$(PEER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,ray,peer]'
	@touch $(PEER_STAMP)

BENCH_PEER_ARGS ?=
bench-peer: install $(PEER_STAMP)
	nice -n 10 $(PY) -m bench.peer $(BENCH_PEER_ARGS)

# The quality guard: our faster modes' replies against the default's on the shipped model with
# real text (bench/quality.py; ~5 minutes on 2 cores, BENCH_QUALITY_ARGS=--quick for one).
BENCH_QUALITY_ARGS ?=
bench-quality: install
	nice -n 10 $(PY) -m bench.quality $(BENCH_QUALITY_ARGS)

soak: install
	$(PY) -m tests.soak

# 3 front-ends on PostgreSQL sharing one Ray Serve deployment against 3 with their own model
# workers: RSS, replies/s, latency, a Ray replica SIGKILLed mid-load. BENCH_MODELSERVER_ARGS=--quick
# for a smoke run. Never part of `make test`.
BENCH_MODELSERVER_ARGS ?=
bench-modelserver: install
	nice -n 10 $(PY) -m bench.modelserver $(BENCH_MODELSERVER_ARGS)

# Replicas on PostgreSQL behind nginx (installed if missing), SIGKILL/SIGTERM mid-load, then
# the poller killed in polling mode; about 12 minutes. Never part of `make test`.
scaleout: install
	$(PY) -m bench.scaleout --mode webhook
	$(PY) -m bench.scaleout --mode polling

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
