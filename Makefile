# Front door. `make build` builds, `make test` installs what is missing, builds and runs every test.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 10
# ONNX's single-op test models (installed with the onnx package): the seeds of `make test`'s mutation fuzz.
ONNX_NODE_TESTS = $$(.venv/bin/python -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node"))')

SANITIZE_DIR ?= build-sanitize
# ccache hits across clones in other folders (CI builds a fresh clone): paths below here are hashed relative to it.
export CCACHE_BASEDIR := $(CURDIR)
# ... and for the -g sanitizer build too (its debug info would otherwise tie each entry to the clone's folder).
export CCACHE_NOHASHDIR := 1

.PHONY: setup build server install wheel tenants-demo test check check-sanitize demo serve augment-demo fuzz clean format

setup:
	@scripts/setup

# The generated Makefile, not CMakeCache.txt, marks a finished configure: a configure that failed (a missing package)
# leaves a cache behind and must run again.
$(BUILD_DIR)/Makefile:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j $(JOBS)

# Only what serving needs: build/bin/osprey-server (the options of `osprey serve`). The Dockerfile builds this.
server: $(BUILD_DIR)/Makefile
	cmake --build $(BUILD_DIR) -j $(JOBS) --target osprey-server

# Libraries, headers, binaries, CMake package and pkg-config file under PREFIX (default /usr/local).
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

# The Python package as a self-contained manylinux wheel in build/wheel/dist (docs/python.md): built by pip with
# scikit-build-core from the same CMake targets (CXX=c++ as the main build, so ccache serves its objects), then
# auditwheel bundles the shared libraries it needs.
wheel: setup
	rm -rf $(BUILD_DIR)/wheel/raw $(BUILD_DIR)/wheel/dist
	CXX=c++ .venv/bin/pip wheel . --no-deps --no-build-isolation --disable-pip-version-check -q -w $(BUILD_DIR)/wheel/raw
	PATH=$(CURDIR)/.venv/bin:$$PATH .venv/bin/auditwheel repair $(BUILD_DIR)/wheel/raw/osprey-*.whl -w $(BUILD_DIR)/wheel/dist
	@ls -l $(BUILD_DIR)/wheel/dist

# Unit tests, ONNX conformance, ORT agreement, image/classify/server tests (ctest), then brief fuzz runs (libFuzzer
# targets; mutated ONNX node test models, fuzz/mutate_models.py). Kernel timings go to $(BUILD_DIR)/test-tuning.tsv, not
# to the user's tuning cache (tests/CMakeLists.txt says why).
test: setup build
	.venv/bin/python tools/make_test_models.py
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	OSPREY_TUNE_CACHE=$(abspath $(BUILD_DIR))/test-tuning.tsv scripts/fuzz $(FUZZ_SECONDS)
	OSPREY_TUNE_CACHE=$(abspath $(BUILD_DIR))/test-tuning.tsv .venv/bin/python fuzz/mutate_models.py \
	  --seconds $(FUZZ_SECONDS) --seed 1 --work $(BUILD_DIR)/mutate-fuzz --bin $(BUILD_DIR)/bin/osprey \
	  --models $(ONNX_NODE_TESTS)

# The fast unit tests alone (GoogleTest, ctest label "unit"): seconds, no models to export.
check: build
	cd $(BUILD_DIR) && ctest -L unit -j $(JOBS) --output-on-failure

# The unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (any UB fails its test), in their own build folder.
check-sanitize: setup
	cmake -S . -B $(SANITIZE_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOSPREY_SANITIZE=ON -DOSPREY_CUDA=OFF >/dev/null
	cmake --build $(SANITIZE_DIR) -j $(JOBS) --target unit_tests
	cd $(SANITIZE_DIR) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest -L unit -j $(JOBS) --output-on-failure

# The engine without the server: classify the demo model's held-out samples, then benchmark ResNet-50.
demo: setup build
	$(BUILD_DIR)/bin/osprey inspect demo-models/digits
	$(BUILD_DIR)/bin/osprey classify demo-models/digits demo-models/digits/samples/*.png --top-k 1
	.venv/bin/python tools/make_test_models.py --only resnet50
	$(BUILD_DIR)/bin/osprey bench $(HOME)/.cache/osprey/models/resnet50.onnx --iters 20

# The model server on the demo repository (the start line prints a curl example to paste).
serve: setup build
	$(BUILD_DIR)/bin/osprey serve --model-repository demo-models

# Augmentation: the demo detection dataset (4 photos with boxes) x 4 copies; writes a contact sheet with the boxes.
augment-demo: setup build
	rm -rf $(BUILD_DIR)/augment-demo
	$(BUILD_DIR)/bin/osprey augment --pipeline demo-datasets/detect.json --input demo-datasets/photos \
	  --output $(BUILD_DIR)/augment-demo --copies 4 --seed 1 --preview 16

# Tenants as heads: three tenants trained on one backbone (digits 0-4) for digits it never saw, served by one process.
tenants-demo: setup build
	.venv/bin/python tools/tenants_demo.py --bin $(BUILD_DIR)/bin/osprey --out $(BUILD_DIR)/tenants-demo

fuzz: setup build
	scripts/fuzz 60
	.venv/bin/python fuzz/mutate_models.py --seconds 60 --work $(BUILD_DIR)/mutate-fuzz --bin $(BUILD_DIR)/bin/osprey

format:
	clang-format -i $$(git ls-files '*.h' '*.cc' '*.cpp')

clean:
	rm -rf $(BUILD_DIR)
