# gavel — the two set-up commands: `make run` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-slow compose-test lint typecheck bench bench-targets chaos chaos-ha clean lock

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	GAVEL_FAST_TIMERS=$${GAVEL_FAST_TIMERS:-1} $(BIN)/gavel up --demo --state $${GAVEL_STATE:-.gavel-demo}

# Three workers on two cores (the tests mostly wait on child processes), each test file on
# one of them (its module fixtures stay with it).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --maxfail=10 --durations=10

# The long versions the default suite keeps a smaller copy of (`@pytest.mark.slow`).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow --maxfail=10 --durations=10

# The gavel image (compose/build-image: a Debian base made once by mmdebstrap, a wheelhouse
# from this tree), then compose/compose.yaml and compose.ha.yaml brought up on it for real
# (`@pytest.mark.compose`), each project torn down by its test, volumes and network included.
# Without a Docker Engine the build is left out and the tests skip, saying why.
compose-test: $(STAMP)
	@if docker version >/dev/null 2>&1; then PYTHON=$(BIN)/python compose/build-image; \
	else echo "compose-test: no Docker Engine answers: the image is not built, the tests skip"; fi
	$(BIN)/python -m pytest -q -m compose --durations=5 tests/integration/test_compose.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/gavel bench

bench-targets: $(STAMP)
	$(BIN)/gavel bench --targets

chaos: $(STAMP)
	$(BIN)/python -m gavel.bench.chaos

# Three clustered nats-servers, three brokers (one leads), a bare remote, workers: leader,
# standby, nats-server and worker kills under submissions, then 0 lost / 0 duplicated.
chaos-ha: $(STAMP)
	$(BIN)/python -m gavel.bench.chaosha

clean:
	rm -rf $(VENV) .gavel-demo .pytest_cache .mypy_cache

# The versions `make test` installs, re-resolved from pyproject.toml in a scratch venv.
lock:
	rm -rf .venv-lock && $(PY) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip
	.venv-lock/bin/python -m pip install -q -e '.[test]'
	{ sed -n 1,2p constraints.txt; .venv-lock/bin/python -m pip freeze | grep -v '^-e\|^gavel\|^#'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .venv-lock
