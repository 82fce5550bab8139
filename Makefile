# Set-up happens on demand: where python3 already has torch, triton and tensorboard (the
# GPU machine) nothing is installed; elsewhere a .venv gets the pinned CPU stack once.
HAVE_DEPS := $(shell python3 -c "import torch, triton, tensorboard" >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_DEPS),yes)
PYTHON := python3
SETUP :=
else
PYTHON := .venv/bin/python
SETUP := .venv/.installed
endif

LOSS ?= padded
KERNEL ?= triton
MODE ?= train
ARGS ?=

.PHONY: profile test test-gpu setup clean-build

profile: $(SETUP)
	$(PYTHON) train.py --loss $(LOSS) --kernel $(KERNEL) --mode $(MODE) $(ARGS)

test: $(SETUP)
	$(PYTHON) -m pytest -q tests

# On the GPU machine: the GPU-marked tests, then compute-sanitizer over both kernels.
test-gpu: $(SETUP)
	$(PYTHON) -m pytest -q -m gpu tests
	compute-sanitizer --tool memcheck --error-exitcode 1 $(PYTHON) tests/sanitize_kernels.py

setup: $(SETUP)

.venv/.installed: requirements-cpu.txt
	python3 -m venv .venv
	.venv/bin/pip install -q -r requirements-cpu.txt
	touch $@

clean-build:
	rm -rf build
