import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Unit tests use one torch thread: small tensors, and results independent of the core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
