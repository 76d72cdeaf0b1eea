"""The OpenMP runtime and wait policy of the binaries (src/cli/omp_env.h, src/threads/team.cc, docs/performance.md
"Under CPU contention"). By default their regions run on osprey's own runtime, with no re-exec. With
OSPREY_OMP_RUNTIME=libgomp they re-execute themselves once with GOMP_SPINCOUNT=1000 (bounded spin, then sleep) when the
user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT; a user's setting is kept. Observed through libgomp itself
(OMP_DISPLAY_ENV=verbose makes it print the values it read at load, on stderr), through OSPREY_OMP_DEBUG=1's lines and
through the running process's environment (/proc/<pid>/environ)."""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OSPREY_OMP_DEFAULT", "OSPREY_OMP_DEBUG", "OMP_DISPLAY_ENV",
            "OSPREY_OMP_RUNTIME", "OSPREY_OMP_SPIN_US", "OSPREY_OMP_YIELD_US")
LIBGOMP = {"OSPREY_OMP_RUNTIME": "libgomp"}
LIBGOMP_DEFAULT_SPIN = "300000"


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(extra)
    return env


def libgomp_spincount(stderr):
    """GOMP_SPINCOUNT as libgomp read it in the last process that loaded it (the re-executed one), and how many
    processes loaded libgomp (2 after a re-exec)."""
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", stderr)
    assert counts, f"libgomp printed no environment (OMP_DISPLAY_ENV=verbose): {stderr!r}"
    return counts[-1], len(counts)


def run(binary, *args, **env):
    return subprocess.run([str(binary), *args], env=clean_env(**env), capture_output=True, text=True, timeout=60)


def test_default_is_osprey_runtime_without_reexec(osprey_bin):
    proc = run(osprey_bin, "--version", OMP_DISPLAY_ENV="verbose", OSPREY_OMP_DEBUG="1")
    assert proc.returncode == 0, proc.stderr
    assert libgomp_spincount(proc.stderr)[1] == 1  # loaded (libdnnl needs it) once: no re-exec
    assert "osprey: openmp: osprey runtime: spin 20 us, yield until 1000 us, then sleep" in proc.stderr
    proc = run(osprey_bin, "--version", OSPREY_OMP_DEBUG="1", OSPREY_OMP_SPIN_US="5", OSPREY_OMP_YIELD_US="300")
    assert "spin 5 us, yield until 300 us" in proc.stderr
    proc = run(osprey_bin, "--version", OSPREY_OMP_DEBUG="1", OMP_WAIT_POLICY="passive")
    assert "spin 0 us, yield until 0 us" in proc.stderr
    proc = run(osprey_bin, "--version", OSPREY_OMP_DEBUG="1", OSPREY_OMP_SPIN_US="5ms")
    assert proc.returncode == 0 and "ignoring OSPREY_OMP_SPIN_US=5ms (want microseconds" in proc.stderr
    assert "spin 20 us" in proc.stderr


def test_libgomp_default_is_bounded_spin_and_stdout_unchanged(osprey_bin):
    proc = run(osprey_bin, "--version", OMP_DISPLAY_ENV="verbose", OSPREY_OMP_DEBUG="1", **LIBGOMP)
    assert proc.returncode == 0, proc.stderr
    assert libgomp_spincount(proc.stderr) == ("1000", 2)
    assert "OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=1000 (osprey default)" in proc.stderr
    # Same stdout (argv kept across the re-exec, nothing extra printed) as without the default.
    plain = run(osprey_bin, "--version", OSPREY_OMP_DEFAULT="0", **LIBGOMP)
    assert proc.stdout == plain.stdout and proc.stdout.strip()


@pytest.mark.parametrize("var,value,spin", [("OMP_WAIT_POLICY", "active", "30000000000"),
                                            ("OMP_WAIT_POLICY", "passive", "0"),
                                            ("GOMP_SPINCOUNT", "10000", "10000")])
def test_user_setting_wins(osprey_bin, var, value, spin):
    proc = run(osprey_bin, "--version", OMP_DISPLAY_ENV="verbose", OSPREY_OMP_DEBUG="1", **{var: value}, **LIBGOMP)
    assert proc.returncode == 0, proc.stderr
    assert f"{var}={value}" in proc.stderr and "(user)" in proc.stderr
    assert libgomp_spincount(proc.stderr) == (spin, 1)  # libgomp loaded once: no re-exec


def test_augment_skips_the_reexec(osprey_bin):
    """`osprey augment` runs its plans on one thread each (no OpenMP team), so it starts without the re-exec."""
    proc = run(osprey_bin, "augment", "--help", OMP_DISPLAY_ENV="verbose", OSPREY_OMP_DEBUG="1", **LIBGOMP)
    assert proc.returncode == 0, proc.stderr
    assert libgomp_spincount(proc.stderr) == (LIBGOMP_DEFAULT_SPIN, 1)
    assert "this command runs no OpenMP team" in proc.stderr


def test_opt_out(osprey_bin):
    proc = run(osprey_bin, "--version", OMP_DISPLAY_ENV="verbose", OSPREY_OMP_DEFAULT="0", **LIBGOMP)
    assert proc.returncode == 0, proc.stderr
    assert libgomp_spincount(proc.stderr) == (LIBGOMP_DEFAULT_SPIN, 1)


@pytest.mark.parametrize("runtime", ["osprey", "libgomp"])
def test_bench_runs_with_default(osprey_bin, tmp_path, runtime):
    """A real run (through the re-exec with libgomp): `bench --json` on stdout still parses; on osprey's runtime its
    regions (oneDNN's and osprey's) ran there."""
    import json

    from test_cli import conv_model
    model = conv_model(tmp_path / "small.onnx")
    proc = run(osprey_bin, "bench", str(model), "--threads", "2", "--iters", "2", "--warmup", "1", "--json",
               OSPREY_OMP_DEBUG="1", **(LIBGOMP if runtime == "libgomp" else {}))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["iters"] == 2
    if runtime == "libgomp":
        assert "(osprey default)" in proc.stderr and "regions" not in proc.stderr
    else:
        regions = re.search(r"osprey: openmp: (\d+) regions", proc.stderr)
        assert regions and int(regions.group(1)) > 0, proc.stderr


def environ_of(pid):
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.mark.parametrize("name", ["osprey", "osprey-server"])
def test_running_server_environment(osprey_bin, tmp_path, name):
    """With libgomp, a long-running process (the server) keeps its pid across the re-exec and runs with the default;
    `osprey serve` executes osprey-server in the same process (serve_exec.cc)."""
    binary = osprey_bin.parent / name
    if not binary.exists():
        pytest.skip(f"{binary} not built")
    args = ["serve"] if name == "osprey" else []
    (tmp_path / "models").mkdir()
    args += ["--model-repository", str(tmp_path / "models"), "--port", "0", "--grpc-port", "-1"]
    proc = subprocess.Popen([str(binary), *args], env=clean_env(**LIBGOMP), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        env = {}
        while time.time() < deadline and proc.poll() is None:
            env = environ_of(proc.pid)
            if "OSPREY_OMP_DEFAULT" in env:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"{name} exited {proc.returncode}: {err}")
        assert env.get("GOMP_SPINCOUNT") == "1000" and env.get("OSPREY_OMP_DEFAULT") == "1000", env
        assert "OMP_WAIT_POLICY" not in env
        assert Path(f"/proc/{proc.pid}/exe").resolve() == (osprey_bin.parent / "osprey-server").resolve()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_binaries_take_every_openmp_entry_point_from_osprey(osprey_bin):
    """Every GOMP_*/omp_* function a binary calls is defined by osprey's runtime (src/threads/team.cc): one the
    runtime lacks would be taken from libgomp, whose teams know nothing of osprey's (a new OpenMP construct in the code,
    say `omp single`, needs its entry point added there)."""
    checked = 0
    for binary in sorted(osprey_bin.parent.iterdir()):
        if not binary.is_file() or not os.access(binary, os.X_OK):
            continue
        undefined = subprocess.run(["nm", "-D", "--undefined-only", str(binary)], capture_output=True, text=True)
        if undefined.returncode != 0:
            continue
        missing = sorted(set(re.findall(r"\b((?:GOMP|omp)_[a-z_0-9]+)@", undefined.stdout)))
        assert not missing, f"{binary.name} takes {missing} from libgomp"
        checked += 1
    assert checked >= 3


def test_plans_flush_subnormals_on_libgomp_workers_too(osprey_bin):
    """libgomp's workers keep the floating-point mode they were created with (osprey's take the region starter's):
    runtime/plan.cc gives them the caller's for a run and puts theirs back after. The unit test creates the workers
    first, in IEEE mode, as PyTorch does when imported before osprey."""
    unit = Path(osprey_bin).parent / "unit_runtime"
    test = "Runtime.PlansFlushSubnormalsToZeroAndLeaveTheCallersModeAsItWas"
    for env in ({}, LIBGOMP):
        proc = run(unit, f"--gtest_filter={test}", **env)
        assert proc.returncode == 0 and "[  PASSED  ] 1 test" in proc.stdout, (env, proc.stdout[-2000:])

