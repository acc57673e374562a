import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Unit tests use one torch thread: small tensors, and results independent of the core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def non_utf8_parquet():
    """Writes a verl parquet file whose one message holds Latin-1 bytes, in a ``binary`` column or
    (mislabelled) in a ``string`` one: ``non_utf8_parquet(path, "binary" | "string") -> str``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def write(path, content_type: str) -> str:
        content = pa.array([b"caf\xe9 ?"], type=pa.binary())
        if content_type == "string":
            content = content.view(pa.string())
        message = pa.StructArray.from_arrays([pa.array(["user"]), content], names=["role", "content"])
        prompt = pa.ListArray.from_arrays(pa.array([0, 1], type=pa.int32()), message)
        pq.write_table(pa.table({"prompt": prompt, "reward_model": pa.array([{"ground_truth": "a"}])}), path)
        return str(path)

    return write
