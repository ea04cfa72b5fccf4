# graphrun: two commands.
#   make demo   install into .venv and run a real example offline (recorded LLM responses)
#   make test   install into .venv and run the whole test suite (what CI runs)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NODE_PREFIX := $(CURDIR)/$(VENV)/node
# The ticket the recorded run in replays/ticket-triage.run.jsonl was made with.
DEMO_TICKET := I was charged twice for my Pro plan this month: two payments of 49 USD on March 3, invoices INV-20931 and INV-20932. Please refund the duplicate charge. Account: dana@brightpixel.io

# Packages type-checked by mypy (strict about untyped definitions; see pyproject.toml).
MYPY_PACKAGES := graphrun.eventstore graphrun.actors graphrun.runtime graphrun.cli

.PHONY: demo test install bench lint typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,mcp,pdf,otel,postgres]'
	@# .ts script nodes run with `npx tsx`: install tsx as a "global" package under
	@# .venv/node (optional; npx finds it there through NPM_CONFIG_PREFIX).
	@if command -v npm >/dev/null 2>&1; then \
	  npm install -g --silent --no-audit --no-fund --prefix $(NODE_PREFIX) tsx@4 >/dev/null 2>&1 \
	    || echo "note: tsx not installed; .ts script tests will be skipped"; fi
	touch $(STAMP)

install: $(STAMP)

# The demo writes to the default database ($$GRAPHRUN_DB, else the user data dir),
# the one `graphrun runs`, `show` and `replay` read in the README's next section.
demo: $(STAMP)
	$(BIN)/graphrun run examples/ticket-triage \
	  "$(DEMO_TICKET)" --llm-replay replays/ticket-triage.run.jsonl

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(MAKE) --no-print-directory typecheck
	@# chromium, graphviz (apt-get, as root) and the Mermaid parser (npm) for the report tests
	@sh tests/support/setup-browser.sh
	@# A real PostgreSQL for the store and worker tests (installed when missing, as root).
	$(BIN)/python -m tests.support.pg --ensure
	NPM_CONFIG_PREFIX="$(NODE_PREFIX)" PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q
	$(BIN)/graphrun test replays/

bench: $(STAMP)
	$(BIN)/python bench/core_bench.py
	$(BIN)/python bench/llm_bench.py
	$(BIN)/python bench/rag_bench.py
	$(BIN)/python bench/replay_suite_bench.py
	$(BIN)/python bench/pg_bench.py

# The installed package maps graphrun.<x> to top-level folders, which mypy cannot
# follow through the editable install: it checks them through a graphrun/ of links.
typecheck: $(STAMP)
	@mkdir -p .mypy/src/graphrun
	@for d in eventstore runtime actors cli; do ln -sfn "$(CURDIR)/$$d" .mypy/src/graphrun/$$d; done
	cd .mypy/src && "$(CURDIR)/$(BIN)/mypy" --config-file "$(CURDIR)/pyproject.toml" \
	  --cache-dir "$(CURDIR)/.mypy/cache" $(addprefix -p ,$(MYPY_PACKAGES))

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .graphrun .mypy build *.egg-info
