"""fusor from Python: tune fused operator chains and call the tuned kernels.

    import fusor, numpy as np
    with fusor.Client.embedded() as client:               # or fusor.Client("host:7788", token=...)
        attention = client.compile("examples/bert_base_attention.fusor", budget=8)
        q, k, v = (np.random.rand(12, 128, 64).astype(np.float32) for _ in range(3))
        out = attention(q, k, v)
"""

from ._chain import Chain, ChainBuilder
from ._client import Client, SweepEntry
from ._embedded import EmbeddedService, find_binary
from ._errors import (AuthError, BuildError, ChainError, EmbeddedError, FusorError, InvalidArgumentError,
                      KernelArgumentError, NotFoundError, ResourceExhaustedError, RpcError, UnavailableError)
from ._kernel import CpuKernel, Kernel, PreparedKernel, TensorSpec, default_cache_dir
from ._result import Explanation, Progress, Result, Started, Task, Worker

__version__ = "0.1.0"

__all__ = [
    "AuthError", "BuildError", "Chain", "ChainBuilder", "ChainError", "Client", "CpuKernel", "EmbeddedError",
    "EmbeddedService", "Explanation", "FusorError", "InvalidArgumentError", "Kernel", "KernelArgumentError", "NotFoundError",
    "PreparedKernel", "Progress", "ResourceExhaustedError", "Result", "RpcError", "Started", "SweepEntry", "Task", "TensorSpec",
    "UnavailableError", "Worker", "default_cache_dir", "find_binary",
]
