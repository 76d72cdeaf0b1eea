"""`cmake --install` gives a library a C++ program finds with find_package(osprey) (and with pkg-config), and the
installed binaries run. The oracle: Relu and a horizontal flip worked out by hand."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("OSPREY_BUILD_DIR", REPO / "build"))
EXPECTED = "relu: 0 2 0 4 0 6\nbox: 30 0 40 5\n"


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    if not (BUILD / "CMakeCache.txt").is_file():
        pytest.fail(f"no build in {BUILD}: run `make build` first", pytrace=False)
    prefix = tmp_path_factory.mktemp("prefix")
    subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], check=True, capture_output=True,
                   timeout=600)
    return prefix


def test_installed_layout(prefix):
    assert (prefix / "include" / "osprey" / "runtime.h").is_file()
    assert (prefix / "lib" / "cmake" / "osprey" / "ospreyConfig.cmake").is_file()
    assert (prefix / "lib" / "pkgconfig" / "osprey.pc").is_file()
    for command in (["osprey-server", "--help"], ["osprey", "serve", "--help"]):
        r = subprocess.run([str(prefix / "bin" / command[0]), *command[1:]], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "--model-repository" in r.stdout and "--grpc-port" in r.stdout, r.stdout


def runpath(binary: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            return line.split("[", 1)[1].rsplit("]", 1)[0].split(":")
    return []


def test_runpath_has_no_relative_entries(prefix):
    # An empty or relative RUNPATH entry makes the loader look for libraries in the current directory: a libz.so.1
    # planted in a dataset folder would run inside `osprey augment`. CMake pads the build tree's RUNPATH with an empty
    # entry when install has to edit it (CMakeLists.txt, BUILD_WITH_INSTALL_RPATH).
    for binary in (BUILD / "bin" / "osprey", BUILD / "bin" / "osprey-server", prefix / "bin" / "osprey",
                   prefix / "bin" / "osprey-server"):
        entries = runpath(binary)
        assert entries, f"{binary}: no RUNPATH"
        bad = [e for e in entries if not (e.startswith("/") or e.startswith("$ORIGIN"))]
        assert not bad, f"{binary}: RUNPATH {':'.join(entries)} has empty or relative entries {bad}"


def needed(binary: Path) -> list[str]:
    out = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].rsplit("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def test_cli_loads_no_server_libraries(tmp_path):
    # `osprey serve` executes osprey-server, so the other commands start without gRPC, TLS and Abseil (37 -> ~10 ms).
    server_libs = ("libgrpc", "libssl", "libcrypto", "libabsl")
    cli = needed(BUILD / "bin" / "osprey")
    assert not [lib for lib in cli if lib.startswith(server_libs)], cli
    assert [lib for lib in needed(BUILD / "bin" / "osprey-server") if lib.startswith("libgrpc")]
    # Without osprey-server beside it, `osprey serve` says what is missing and how to get it.
    shutil.copy(BUILD / "bin" / "osprey", tmp_path / "osprey")
    r = subprocess.run([str(tmp_path / "osprey"), "serve", "--model-repository", str(tmp_path)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "osprey-server" in r.stderr and "make build" in r.stderr, r.stderr


def test_find_package(prefix, tmp_path):
    build = tmp_path / "build"
    env = dict(os.environ, CCACHE_DISABLE="1")
    subprocess.run(["cmake", "-S", str(Path(__file__).parent / "example"), "-B", str(build),
                    f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True,
                   timeout=300, env=env)
    r = subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = subprocess.run([str(build / "user")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == EXPECTED, out.stdout + out.stderr


def test_pkg_config(prefix, tmp_path):
    if not shutil.which("pkg-config"):
        pytest.skip("pkg-config is not installed")
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "osprey"], capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    binary = tmp_path / "user"
    r = subprocess.run(["g++", "-std=c++20", "-O1", str(Path(__file__).parent / "example" / "main.cc"), "-o",
                        str(binary), *flags], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(binary)], capture_output=True, text=True, timeout=60)
    assert out.stdout == EXPECTED, out.stdout + out.stderr
