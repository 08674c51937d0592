"""CUDA kernels: the launch read from the scheduler's answer, the argument struct, and the checks, with a
recording driver in place of libcuda; on a machine with a GPU, a real launch against PyTorch."""

import ctypes
import json
import subprocess
from types import SimpleNamespace

import pytest

import fusor
from fusor._cuda import CudaDriver, CudaKernel
from fusor.v1 import scheduler_pb2

from conftest import REPO, binary


def cuda_answer(chain: str, tmp_path, with_launch: bool = True) -> scheduler_pb2.CompileResponse:
    """The answer a scheduler gives for `chain` on an H200, made from the model's pick (no GPU needed)."""
    subprocess.run([str(binary("fusor")), "compile", "--model-only", "--target", "h200", "-o", str(tmp_path),
                    str(REPO / "examples" / f"{chain}.fusor")], check=True, capture_output=True)
    meta = json.loads((tmp_path / f"{chain}.json").read_text())["kernel"]
    if with_launch:  # as worker/cuda/cuda_backend.cc adds it
        meta["launch"] = {"grid": [meta["grid"], 1, 1], "block": [meta["threads"], 1, 1],
                          "dynamic_shared_bytes": meta["shared_bytes"]}
    response = scheduler_pb2.CompileResponse(language="cuda", entry_point=meta["kernel"], metadata_json=json.dumps(meta),
                                             kernel_source=(tmp_path / f"{chain}.cu").read_text(),
                                             binary=b"\x7fELF cubin", binary_format="cubin")
    response.result.workload_key = "k" * 32
    return response


class RecordingDriver:
    """CudaDriver's interface, recording the calls."""

    def __init__(self):
        self.calls = []
        self.next = 0x1000

    def load(self, device, cubin, name, shared_bytes, argument_bytes):
        self.calls.append(("load", device, cubin, name, shared_bytes, argument_bytes))
        return 0xE00, 0xF00

    def zeroed(self, device, nbytes, stream):
        self.next += 0x100000
        self.calls.append(("zeroed", device, nbytes, stream, self.next))
        return self.next

    def launch(self, device, fn, grid, block, shared_bytes, stream, args):
        self.calls.append(("launch", device, fn, grid, block, shared_bytes, stream, [a or 0 for a in args],
                           ctypes.sizeof(args)))

    def release(self, device, modules, buffers):
        self.calls.append(("release", device, modules, sorted(buffers)))


class FakeTensor:
    def __init__(self, shape, dtype="torch.float32", device="cuda", index=0, contiguous=True, ptr=0):
        self.shape, self.dtype = tuple(shape), dtype
        self.device = SimpleNamespace(type=device, index=index)
        self._contiguous, self._ptr = contiguous, ptr
        self.requires_grad = False

    def is_contiguous(self):
        return self._contiguous

    def data_ptr(self):
        return self._ptr


def tensors(kernel, base=0x10000):
    ins = [FakeTensor(s.shape, ptr=base + i * 0x1000) for i, s in enumerate(kernel.inputs)]
    outs = [FakeTensor(s.shape, ptr=base + 0x100000 + i * 0x1000) for i, s in enumerate(kernel.outputs)]
    return ins, outs


def test_a_kernel_without_workspace_launches_with_the_answers_grid_and_pointers(tmp_path):
    driver = RecordingDriver()
    kernel = CudaKernel(cuda_answer("conv_chain", tmp_path), driver=driver)
    assert kernel.grid == (49, 1, 1) and kernel.block == (128, 1, 1) and kernel.workspace_bytes == 0
    ins, outs = tensors(kernel)
    assert kernel(*ins, out=outs[0], stream=7) is outs[0]
    assert kernel(*ins, out=outs[0], stream=7) is outs[0]
    load, launch, again = driver.calls
    pointers = 8 * len(ins + outs)
    assert load == ("load", 0, b"\x7fELF cubin", kernel.entry_point, kernel.shared_bytes, pointers)
    assert launch[:7] == ("launch", 0, 0xF00, (49, 1, 1), (128, 1, 1), kernel.shared_bytes, 7)
    # The argument struct: the input pointers, then the outputs', nothing else.
    assert launch[7] == [t.data_ptr() for t in ins + outs] and launch[8] == pointers
    assert again == launch
    kernel.close()
    assert driver.calls[-1] == ("release", 0, [0xE00], [])


def test_raw_pointers_launch_as_the_pytorch_backend_calls_them(tmp_path):
    # fusor.torch reads strided views in place: it passes each view's first-element pointer, unchecked.
    driver = RecordingDriver()
    kernel = CudaKernel(cuda_answer("bert_base_attention", tmp_path), driver=driver)
    ins = [0x20000 + 0x40 * i for i in range(len(kernel.inputs))]
    kernel.run_pointers(ins, [0x90000], device=1, stream=5)
    load, *zeroed, launch = driver.calls
    assert load[:2] == ("load", 1)
    workspace = [zeroed[0][4]] if kernel.workspace_bytes else []
    assert launch[:2] == ("launch", 1) and launch[6] == 5
    assert launch[7] == ins + [0x90000] + workspace
    with pytest.raises(fusor.KernelArgumentError, match="takes 3 inputs and 1 outputs"):
        kernel.run_pointers(ins[:2], [0x90000], device=1, stream=5)


def test_a_workspace_is_zeroed_once_per_stream_on_that_stream(tmp_path):
    driver = RecordingDriver()
    kernel = CudaKernel(cuda_answer("bert_base_attention", tmp_path, with_launch=False), driver=driver)
    assert kernel.shared_bytes > 48 * 1024 and kernel.workspace_bytes > 0
    ins, outs = tensors(kernel)
    kernel(*ins, out=outs, stream=1)
    kernel(*ins, out=outs, stream=1)
    kernel(*ins, out=outs, stream=2)
    zeroed = [c for c in driver.calls if c[0] == "zeroed"]
    launches = [c for c in driver.calls if c[0] == "launch"]
    assert [(z[2], z[3]) for z in zeroed] == [(kernel.workspace_bytes, 1), (kernel.workspace_bytes, 2)]
    assert launches[0][7][-1] == launches[1][7][-1] == zeroed[0][4]
    assert launches[2][7][-1] == zeroed[1][4]
    assert launches[0][7][:-1] == [t.data_ptr() for t in ins + outs]
    del kernel  # dropping the kernel frees what it holds
    assert driver.calls[-1] == ("release", 0, [0xE00], sorted(z[4] for z in zeroed))


def test_tensors_are_checked_before_a_launch(tmp_path):
    driver = RecordingDriver()
    kernel = CudaKernel(cuda_answer("conv_chain", tmp_path), driver=driver)
    ins, outs = tensors(kernel)
    shape = kernel.inputs[0].shape
    cases = [
        (FakeTensor(shape, device="cpu"), outs, "input I is on .*cpu.*runs on a CUDA GPU"),
        (FakeTensor(shape, dtype="torch.float16"), outs, "input I must be torch.float32, got torch.float16"),
        (FakeTensor((1,) + shape), outs, "input I must have shape"),
        (FakeTensor(shape, contiguous=False), outs, "input I must be contiguous"),
        (object(), outs, "input I must be a PyTorch CUDA tensor"),
        (ins[0], [FakeTensor(outs[0].shape, index=1)], "output .* is on cuda:1, the others on cuda:0"),
    ]
    assert kernel.inputs[0].name == "I"
    for first, out, message in cases:
        with pytest.raises(fusor.KernelArgumentError, match=message):
            kernel(first, *ins[1:], out=out, stream=0)
    assert not [c for c in driver.calls if c[0] == "launch"]


def test_an_answer_without_a_cubin_says_why(tmp_path):
    response = cuda_answer("conv_chain", tmp_path)
    response.binary = b""
    meta = json.loads(response.metadata_json)
    meta["binary"] = {"missing": "NVRTC not found"}
    response.metadata_json = json.dumps(meta)
    with pytest.raises(fusor.BuildError, match="no cubin for this CUDA kernel: NVRTC not found"):
        CudaKernel(response)


def test_without_a_driver_the_first_call_fails_clearly(tmp_path):
    with pytest.raises(fusor.BuildError, match="no CUDA driver"):
        CudaDriver("libcuda-that-does-not-exist.so")


class FakeLibcuda:
    """The driver entry points CudaDriver calls, checking the ctypes types it passes and recording the calls."""

    def __init__(self, param_bytes):
        self.calls = []
        self.param_bytes = param_bytes
        self.current = []

    def cuDevicePrimaryCtxRetain(self, ctx, device):
        assert isinstance(device, ctypes.c_int)
        ctx._obj.value = 0xC0 + device.value
        return 0

    def cuCtxPushCurrent_v2(self, ctx):
        self.current.append(ctx.value)
        return 0

    def cuCtxPopCurrent_v2(self, ctx):
        self.current.pop()
        return 0

    def cuModuleLoadData(self, module, image):
        assert isinstance(image, ctypes.c_char_p)
        module._obj.value = 0xA0
        self.calls.append(("load", image.value, self.current[-1]))
        return 0

    def cuModuleGetFunction(self, fn, module, name):
        fn._obj.value = 0xB0
        self.calls.append(("function", module.value, name))
        return 0

    def cuFuncGetParamInfo(self, fn, index, offset, size):
        offset._obj.value, size._obj.value = 0, self.param_bytes
        return 0

    def cuFuncSetAttribute(self, fn, attribute, value):
        self.calls.append(("attribute", attribute, value))
        return 0

    def cuMemAlloc_v2(self, ptr, nbytes):
        assert isinstance(ptr._obj, ctypes.c_uint64) and isinstance(nbytes, ctypes.c_size_t)
        ptr._obj.value = 0xD000000000
        return 0

    def cuMemsetD8Async(self, ptr, value, nbytes, stream):
        self.calls.append(("memset", ptr.value, value.value, nbytes.value, stream.value, self.current[-1]))
        return 0

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        assert all(isinstance(x, ctypes.c_uint) for x in (gx, gy, gz, bx, by, bz, shared))
        assert isinstance(fn, ctypes.c_void_p) and isinstance(stream, ctypes.c_void_p) and extra is None
        struct = (ctypes.c_uint64 * (self.param_bytes // 8)).from_address(params[0])
        self.calls.append(("launch", fn.value, (gx.value, gy.value, gz.value), (bx.value, by.value, bz.value),
                           shared.value, stream.value, list(struct), self.current[-1]))
        return 0

    def cuMemFree_v2(self, ptr):
        self.calls.append(("free", ptr.value))
        return 0

    def cuModuleUnload(self, module):
        self.calls.append(("unload", module.value))
        return 0

    def cuGetErrorString(self, rc, text):
        text._obj.value = b"fake error"
        return 0


def fake_driver(lib):
    driver = CudaDriver.__new__(CudaDriver)
    driver._lib, driver._contexts = lib, {}
    return driver


def test_the_driver_is_called_with_the_struct_and_types_the_kernel_expects(tmp_path):
    response = cuda_answer("bert_base_attention", tmp_path)
    probe = CudaKernel(response, driver=RecordingDriver())
    pointers = len(probe.inputs) + len(probe.outputs) + 1
    lib = FakeLibcuda(param_bytes=8 * pointers)
    kernel = CudaKernel(response, driver=fake_driver(lib))
    ins, outs = tensors(kernel)
    for t in ins + outs:
        t.device.index = 1
    kernel(*ins, out=outs, stream=0x5)
    assert lib.current == [], "a context was left current"
    load, function, attribute, memset, launch = lib.calls
    assert load == ("load", b"\x7fELF cubin", 0xC1)  # in cuda:1's primary context
    assert function == ("function", 0xA0, kernel.entry_point.encode())
    assert attribute == ("attribute", 8, kernel.shared_bytes)
    assert memset == ("memset", 0xD000000000, 0, kernel.workspace_bytes, 0x5, 0xC1)
    assert launch == ("launch", 0xB0, kernel.grid, kernel.block, kernel.shared_bytes, 0x5,
                      [t.data_ptr() for t in ins + outs] + [0xD000000000], 0xC1)
    kernel.close()
    assert lib.calls[-2:] == [("free", 0xD000000000), ("unload", 0xA0)]

    # A cubin whose kernel takes another argument size than the metadata describes is refused.
    lib = FakeLibcuda(param_bytes=8 * (pointers + 1))
    kernel = CudaKernel(response, driver=fake_driver(lib))
    with pytest.raises(fusor.BuildError, match="takes a .*-byte argument"):
        kernel(*ins, out=outs, stream=0x5)
    assert lib.current == []


def _gpu():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _gpu(), reason="needs PyTorch with a CUDA GPU")
def test_on_a_gpu_attention_matches_pytorch(tmp_path):
    import torch

    from conftest import BUILD, TEST_SCHEDULER

    with fusor.Client.embedded(bin_dir=BUILD, backend="cuda", scheduler_args=TEST_SCHEDULER) as client:
        kernel = client.compile(REPO / "examples" / "bert_large_attention_f16.fusor", backend="cuda", budget=4)
        q, k, v = (torch.randn(s.shape, dtype=torch.float16, device="cuda") for s in kernel.inputs[:3])
        mask = torch.zeros(kernel.inputs[3].shape, dtype=torch.float16, device="cuda")
        out = kernel(q, k, v, mask)
        torch.cuda.synchronize()
        ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * 0.125, -1) @ v.float()
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)
