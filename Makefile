# livox_infer: set up, test, demo, benchmark.  Every target sets up first (fast when already done).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Compiled kernels and packages live in livox_infer's one cache folder (~/.cache/livox_infer, LIVOX_INFER_CACHE_DIR;
# livox_infer/cache.py), the same for make, the node, detect and the benches.
export LIVOX_INFER_VENV := $(abspath $(VENV))

.PHONY: setup package test test-fast demo bench freeze interfaces clean-build

setup:
	bash scripts/setup.sh

# The AOTInductor packages the node and detect start from in ~1 s (setup builds them too, unless SKIP_PACKAGES=1):
# lite on its own grid and on the grids of PACKAGE_SENSORS; each is skipped when a matching one is there.
package: setup
	bash scripts/build_packages.sh $(VENV)

# pytest exit 5 = no tests collected: a failure here (make then exits 2), never a silent pass.
test: setup
	$(PY) -m pytest -q || { rc=$$?; [ $$rc -ne 5 ] || echo "make test: pytest collected no tests" >&2; exit $$rc; }

# The fast lane while editing: everything but the tests marked slow (pytest.ini), a minute or two on 2 cores.
test-fast: setup
	$(PY) -m pytest -q -m "not slow" || { rc=$$?; [ $$rc -ne 5 ] || echo "make test-fast: pytest collected no tests" >&2; exit $$rc; }

demo: setup
	$(PY) -m livox_infer.tools.demo

bench: setup
	$(PY) -m livox_infer.tools.cli bench decode
	$(PY) -m livox_infer.tools.cli bench voxelize
	$(PY) -m livox_infer.tools.cli bench pipeline

# Rebuild only the interface packages (vision_msgs, livox_ros_driver2).
interfaces:
	FORCE=1 bash scripts/build_interfaces.sh $(VENV)

# Print the current venv's pins (compare with requirements*.txt after a deliberate upgrade).
freeze:
	$(PY) -m pip freeze --exclude-editable

clean-build:
	rm -rf build/interfaces
