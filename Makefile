# Set-up happens on demand: where python3 already has torch, triton and tensorboard (the
# GPU machine) nothing is installed; elsewhere a .venv gets requirements-cpu.txt once
# (and requirements-hta.txt, without its dependencies).
HAVE_DEPS := $(shell python3 -c "import torch, triton, tensorboard" >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_DEPS),yes)
PYTHON := python3
SETUP :=
else
PYTHON := .venv/bin/python
SETUP := .venv/.installed
endif

LOGDIR ?= profiles
PORT ?= 6006
LOSS ?= padded
KERNEL ?= triton
BACKEND ?= $(KERNEL)
MODE ?= train
ARGS ?=
# GPUS=N > 1: N ranks under torchrun (training/launch.py), one per GPU, or N CPU processes
# (gloo) on a machine without GPUs; --batch-size stays per rank.
# NODES=H > 1: H hosts, each running the same command with its own GPUS, meeting at
# RDZV=host:port (torchrun's c10d rendezvous; the first host's address, say), each waiting
# at most RDZV_WAIT seconds for the others.
# Where no NVIDIA GPU is, the venv takes torch's CPU build from this index (see Set-up).
TORCH_INDEX ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,https://download.pytorch.org/whl/cpu)
GPUS ?= 1
NODES ?= 1
RDZV ?=
RDZV_WAIT ?= 300
ifeq ($(GPUS)$(NODES),11)
LAUNCH := $(PYTHON)
else ifeq ($(NODES),1)
LAUNCH := $(PYTHON) -m training.launch --nproc $(GPUS)
else
LAUNCH := $(PYTHON) -m training.launch --nproc $(GPUS) --nnodes $(NODES) --rdzv "$(RDZV)" \
	--wait $(RDZV_WAIT)
endif

.PHONY: profile compare ladder sweep throughput scaling costmodel ncu test test-gpu test-browser lint tensorboard setup clean-build

profile: $(SETUP)
	$(LAUNCH) train.py --loss $(LOSS) --backend $(BACKEND) --mode $(MODE) $(ARGS)

# Every strategy, both modes, side by side; RUNS="profiles/a profiles/b" rebuilds a
# comparison from finished runs without running anything.
RUNS ?=
compare: $(SETUP)
	$(if $(RUNS),$(PYTHON),$(LAUNCH)) -m studies.compare $(if $(RUNS),--runs $(RUNS),) $(ARGS)

# The step's speed-ups added one at a time from --baseline (studies/ladder.py).
LADDER ?= padded,kernel:cuda
ladder: $(SETUP)
	$(PYTHON) -m studies.ladder --strategies $(LADDER) $(ARGS)

# Each loss strategy alone (forward + backward) over batch size, box capacity and boxes per
# image (studies/sweep.py); ARGS="--batch 64,1024 --capacity 256,4096" and so on.
sweep: $(SETUP)
	$(PYTHON) -m studies.sweep $(ARGS)

# What each strategy sustains over an epoch against the GPU's own rate (studies/throughput.py);
# ARGS="--strategies padded,kernel:triton --loader torch" and so on; GPUS=N: on N ranks,
# ARGS="--against profiles/throughput-<one GPU's>" adds each strategy's scaling.
throughput: $(SETUP)
	$(LAUNCH) -m studies.throughput $(ARGS)

# The --parallel designs side by side on N ranks, one table (studies/scaling.py): GPUS=2 or
# more; ARGS="--designs ddp,tp --strategy kernel:cuda --scaling-baseline <one GPU's run>".
scaling: $(SETUP)
	$(LAUNCH) -m studies.scaling $(ARGS)

# Each --parallel design's step on N GPUs predicted from one GPU's measurements
# (studies/cost_model.py; bench/sharded_rank.py measures them on the device).
costmodel: $(SETUP)
	$(PYTHON) -m studies.cost_model $(ARGS)

# The loss kernels of a short run through Nsight Compute (studies/ncu.py), on the GPU
# machine: make ncu LOSS=kernel BACKEND=cuda (LOSS and BACKEND only where given: the
# default strategy, padded, has no kernel of its own).
# One line when make echoes it (a continued recipe line echoed as a blank one).
NCU_ARGS = $(if $(filter-out file,$(origin LOSS)),--loss $(LOSS)) \
  $(if $(filter-out file,$(origin BACKEND) $(origin KERNEL)),--backend $(BACKEND))
ncu: $(SETUP)
	$(PYTHON) -m studies.ncu $(strip $(NCU_ARGS) $(ARGS))

# The CPU suite (Triton kernels in Triton's interpreter), shared by TEST_WORKERS pytest
# processes (tests/gpu_suite.py, as make test-gpu): on 2 cores 3 beat 2, as many tests
# wait on the processes they start. The browser test is make test-browser's. One file
# alone: $(PYTHON) -m pytest tests/<file>.
TEST_WORKERS ?= 3
test: $(SETUP)
	@echo "make test: the CPU suite, $(TEST_WORKERS) pytest workers side by side (a line a minute, the failures in full and the 20 slowest at the end)"
	$(PYTHON) -m tests.gpu_suite --workers $(TEST_WORKERS) --marker "not browser" --no-sanitizer $(ARGS)

# ruff over the project's Python (ruff.toml); make setup installs it, CI runs it first.
lint: $(SETUP)
	$(PYTHON) -m ruff check .

# On the GPU machine: the GPU-marked tests shared by 6 pytest workers, compute-sanitizer
# over the kernels beside them (tests/gpu_suite.py); ARGS="--workers 4", a test path...
test-gpu: $(SETUP)
	$(PYTHON) -m tests.gpu_suite $(ARGS)

# The TensorBoard page in headless Chromium (Debian's chromium + chromium-driver, installed
# here when missing: needs root or sudo); screenshots land in profiles/screenshots.
test-browser: $(SETUP)
	@echo "make test-browser: TensorBoard in headless Chromium (installs chromium first when missing)"
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } || \
	  { echo "error: could not install chromium and chromium-driver (apt-get as root)"; exit 2; }
	REQUIRE_BROWSER=1 SCREENSHOT_DIR=profiles/screenshots $(PYTHON) -m pytest -q -m browser tests

# TensorBoard with the profiler plugin on the runs, on localhost only, fixed for torch 2.x
# GPU traces and for browsers without internet (viewer/tb_profiler_compat.py).
tensorboard: $(SETUP)
	$(PYTHON) -m viewer.serve --logdir $(LOGDIR) --port $(PORT)

setup: $(SETUP)

# PIP_CONSTRAINT, where set, narrows the versions (CI pins triton: .ci/constraints.txt).
# TORCH_INDEX, where reachable, is searched beside the default index: its 2.13.0+cpu
# outranks the public 2.13.0 (CUDA, 5 GB). It is probed first (5 s) because pip would
# otherwise retry an unreachable index for minutes; unreachable, the default index serves.
.venv/.installed: requirements-cpu.txt requirements-hta.txt
	python3 -m venv .venv
	@extra=; if [ -n "$(TORCH_INDEX)" ]; then \
	  if python3 -c "import urllib.request as u; u.urlopen('$(TORCH_INDEX)/torch/', timeout=5)" \
	    2>/dev/null; then extra="--extra-index-url $(TORCH_INDEX)"; \
	    echo "make: torch from $(TORCH_INDEX) (make TORCH_INDEX= takes the default index's build)"; \
	  else echo "make: $(TORCH_INDEX) unreachable; torch from the default index"; fi; fi; \
	echo ".venv/bin/pip install -q $$extra -r requirements-cpu.txt"; \
	.venv/bin/pip install -q $$extra -r requirements-cpu.txt
	.venv/bin/pip install -q --no-deps -r requirements-hta.txt
	touch $@

clean-build:
	rm -rf build
