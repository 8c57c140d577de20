"""engine/kv_capacity.py: the pool arithmetic the model runner sizes its pool with and the
tuner Job bounds its search space with (tests/tuner/test_tuner_space_bounds.py)."""
from __future__ import annotations

import pytest
import torch

from engine.kv_capacity import KVShape, blocks_for, dtype_name, num_kv_blocks


@pytest.mark.parametrize("requested, config_dtype, device, want", [
    ("auto", "bfloat16", "cpu", "float32"),
    ("auto", torch.float16, "cuda", "float16"),
    ("auto", "bfloat16", "cuda", "bfloat16"),
    ("auto", "float32", "cuda", "bfloat16"),
    ("auto", None, "cuda", "bfloat16"),
    ("float16", "bfloat16", "cpu", "float16"),
])
def test_the_runner_and_the_tuner_pick_one_dtype(requested, config_dtype, device, want):
    # imported here: engine.model_runner brings in triton.language, which must come after
    # tests/kernels/conftest.py sets TRITON_INTERPRET (else its interpreted kernels fail)
    from engine.model_runner import pick_dtype

    assert dtype_name(requested, config_dtype, device) == want
    config = type("Config", (), {"dtype": config_dtype})()
    assert pick_dtype(requested, config, torch.device(device)) == getattr(torch, want)


def test_kv_shape_from_a_config_dict_or_object():
    gqa = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "hidden_size": 256}
    shape = KVShape.of(gqa)
    assert shape == KVShape(4, 2, 32)
    assert shape.bytes_per_token(2) == 2 * 4 * 2 * 32 * 2
    assert shape.bytes_per_block(16, 2) == 16 * shape.bytes_per_token(2)
    mha = type("Config", (), {"num_hidden_layers": 2, "num_attention_heads": 4,
                              "hidden_size": 64, "head_dim": 32})()
    assert KVShape.of(mha) == KVShape(2, 4, 32)   # head_dim given; kv heads = heads


def test_the_pool_is_the_fraction_minus_weights_and_activations_in_whole_blocks():
    assert num_kv_blocks(device_bytes=1000, fraction=0.5, weight_bytes=100,
                         activation_bytes=50, block_bytes=70) == 5     # 350 // 70
    assert num_kv_blocks(device_bytes=1000, fraction=0.5, weight_bytes=100,
                         activation_bytes=50, block_bytes=71) == 4
    assert num_kv_blocks(device_bytes=100, fraction=0.5, weight_bytes=60,
                         activation_bytes=0, block_bytes=8) < 1
    assert (blocks_for(256, 16), blocks_for(257, 16), blocks_for(1, 128)) == (16, 17, 1)
