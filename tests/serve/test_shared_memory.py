"""Triton's system shared memory extension against the real server, driven by tritonclient as Triton users drive it
(tritonclient.utils.shared_memory, HTTP and gRPC): register, status, infer with inputs and outputs in shared memory,
unregister; and what a hostile or careless client does (unknown regions, sizes past the end, an object shrunk after it
was registered, a CUDA region, the extension left off). Oracles: ONNX Runtime on the same model, the bytes written."""

import os
import re

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def shm_server(start_server):
    server = start_server("--allow-shared-memory", "--grpc-port", 0, "--max-shared-memory-regions", 4,
                          "--max-body-size", 200_000)
    server.grpc_port = int(re.search(r"gRPC on 127\.0\.0\.1:(\d+)", server.output()).group(1))
    return server


@pytest.fixture
def regions():
    """regions(name, byte_size) -> handle of a new shared memory object; all destroyed when the test ends."""
    made = []

    def make(name, byte_size):
        handle = shm.create_shared_memory_region(name, f"/osprey_test_{os.getpid()}_{name}", byte_size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def ort_logits(demo_model, x):
    session = ort.InferenceSession(str(demo_model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"image": x})[0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_and_outputs_through_system_shared_memory(shm_server, regions, demo_model, protocol):
    client_module = httpclient if protocol == "http" else grpcclient
    port = shm_server.port if protocol == "http" else shm_server.grpc_port
    client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
    client.unregister_system_shared_memory()
    x = RNG.random((3, 1, 32, 32), dtype=np.float32)
    # The input 64 bytes into a region registered 32 bytes into its object: offsets add.
    in_handle = regions(f"in_{protocol}", 32 + 64 + x.nbytes)
    shm.set_shared_memory_region(in_handle, [x], offset=32 + 64)
    out_handle = regions(f"out_{protocol}", 4096)
    client.register_system_shared_memory("in", f"/osprey_test_{os.getpid()}_in_{protocol}", 64 + x.nbytes, offset=32)
    client.register_system_shared_memory("out", f"/osprey_test_{os.getpid()}_out_{protocol}", 4096)
    status = client.get_system_shared_memory_status()
    if protocol == "grpc":
        status = [{"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                  for r in status.regions.values()]
    assert sorted((r["name"], int(r["offset"]), int(r["byte_size"])) for r in status) == [
        ("in", 32, 64 + x.nbytes), ("out", 0, 4096)]

    inp = client_module.InferInput("image", list(x.shape), "FP32")
    inp.set_shared_memory("in", x.nbytes, offset=64)
    out = client_module.InferRequestedOutput("logits")
    out.set_shared_memory("out", 4096 - 100, offset=100)
    result = client.infer("digits", [inp], outputs=[out])
    answer = result.get_output("logits")
    if protocol == "grpc":
        assert list(answer.shape) == [3, 10] and not answer.parameters
        assert result.get_response().raw_output_contents == [b""]
    else:  # name, datatype and shape only, as Triton answers (its C++ client reads any 'parameters' as binary data)
        assert answer == {"name": "logits", "datatype": "FP32", "shape": [3, 10]}
    logits = shm.get_contents_as_numpy(out_handle, np.float32, [3, 10], offset=100)
    np.testing.assert_allclose(logits, ort_logits(demo_model, x), rtol=1e-4, atol=1e-4)

    if protocol == "grpc":
        # An output in shared memory beside one that is not: raw_output_contents keeps one entry per output.
        both = client.infer("digits", [inp], outputs=[out, grpcclient.InferRequestedOutput("logits", class_count=2)])
        raw = both.get_response().raw_output_contents
        assert len(raw) == 2 and raw[0] == b"" and len(raw[1]) > 0
    client.unregister_system_shared_memory("in")
    with pytest.raises(InferenceServerException, match="'in' is not registered"):
        client.infer("digits", [inp])
    client.unregister_system_shared_memory()
    assert len(client.get_system_shared_memory_status() if protocol == "http"
               else client.get_system_shared_memory_status().regions) == 0


def test_bad_regions_get_clear_errors_and_the_server_lives(shm_server, regions):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{shm_server.port}")
    client.unregister_system_shared_memory()
    key = f"/osprey_test_{os.getpid()}_bad"
    handle = regions("bad", 8192)

    def refused(match, call, *args, **kwargs):
        with pytest.raises(InferenceServerException, match=match):
            call(*args, **kwargs)

    refused("cannot open shared memory object", client.register_system_shared_memory, "a", "/osprey_no_such", 16)
    refused("not a shared memory object name", client.register_system_shared_memory, "a", "/../etc/passwd", 16)
    refused("past the end", client.register_system_shared_memory, "a", key, 8192, offset=1)
    refused("past the end", client.register_system_shared_memory, "a", key, 2**64 - 1, offset=2)
    client.register_system_shared_memory("a", key, 8192)
    refused("registered already", client.register_system_shared_memory, "a", key, 16)

    def infer(shape, byte_size, offset=0, out=None):
        inp = httpclient.InferInput("image", shape, "FP32")
        inp.set_shared_memory("a", byte_size, offset=offset)
        return client.infer("digits", [inp], outputs=out)

    refused("does not match shape", infer, [1, 1, 32, 32], 4000)
    refused("past the end of region 'a'", infer, [2, 1, 32, 32], 8192, offset=4)
    refused(r"over the server's limit of 200000 per input \(--max-body-size\)", infer, [64, 1, 32, 32], 64 * 4096)
    small_out = httpclient.InferRequestedOutput("logits")
    small_out.set_shared_memory("a", 39)
    refused("do not fit the 39", infer, [1, 1, 32, 32], 4096, out=[small_out])
    # The client shrinks its object after registering it: an error answer, not a SIGBUS in the server.
    fd = os.open(f"/dev/shm{key}", os.O_RDWR)
    os.ftruncate(fd, 100)
    os.close(fd)
    refused("is now 100 bytes", infer, [2, 1, 32, 32], 8192)
    assert client.is_server_live()
    # --max-shared-memory-regions 4.
    for name in ("b", "c", "d"):
        client.register_system_shared_memory(name, key, 16)
    refused("its limit", client.register_system_shared_memory, "e", key, 16)
    status, _, body = shm_server.request("POST", "/v2/systemsharedmemory/region/x/register", {"key": key})
    assert status == 400 and b"byte_size" in body
    client.unregister_system_shared_memory()
    # CUDA shared memory: no regions, and registering one says what to use instead.
    assert client.get_cuda_shared_memory_status() == []
    status, _, body = shm_server.request("POST", "/v2/cudasharedmemory/region/g/register",
                                         {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 16})
    assert status == 400 and b"register system shared memory instead" in body
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]


def test_shared_memory_is_off_unless_allowed(server, triton, regions):
    """The default server: a client must not make it read shared memory objects unless the operator allowed it."""
    handle = regions("off", 4096)
    with pytest.raises(InferenceServerException, match="--allow-shared-memory"):
        triton.register_system_shared_memory("r", f"/osprey_test_{os.getpid()}_off", 4096)
    inp = httpclient.InferInput("image", [1, 1, 32, 32], "FP32")
    inp.set_shared_memory("r", 4096)
    with pytest.raises(InferenceServerException, match="--allow-shared-memory"):
        triton.infer("digits", [inp])
    assert "system_shared_memory" not in triton.get_server_metadata()["extensions"]
    del handle
