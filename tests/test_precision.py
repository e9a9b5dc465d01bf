"""The precision policy: TF32 rounding as the tensor cores do it, torch's switches set and restored, the policy
reaching database keys, one-line errors (the zoo's TF32 arithmetic against the tf32 tolerance:
``tests/zoo/test_tf32_tolerance.py``)."""

import pytest
import torch

from korch import config, precision
from korch.backends.measure import device_key
from korch.errors import KorchError
from korch.pipeline import optimize


def test_tf32_keeps_ten_mantissa_bits_rounding_to_nearest():
    x = torch.tensor([1.0, 1.0 + 2**-10, 1.0 + 2**-11, 1.0 + 2**-11 + 2**-20, -(1.0 + 2**-12), 3.0e38,
                      float("inf"), float("nan")])
    y = precision.round_to_tf32(x)
    assert y[:5].tolist() == [1.0, 1.0 + 2**-10, 1.0 + 2**-10, 1.0 + 2**-10, -1.0]  # a tie rounds away from zero
    assert y[6] == float("inf") and torch.isnan(y[7])
    r = precision.round_to_tf32(torch.randn(1000))
    assert (r.view(torch.int32) & 0x1FFF).eq(0).all()
    assert precision.round_to_tf32(torch.ones(3, dtype=torch.float64)).dtype == torch.float64


def test_emulated_tf32_rounds_the_operands_of_products_only():
    a, b = torch.randn(64, 256), torch.randn(256, 32)
    exact = a @ b
    with precision.emulated("tf32"):
        rounded = a @ b
        conv = torch.nn.functional.conv2d(a.view(1, 1, 64, 256), b[:3, :3].reshape(1, 1, 3, 3))
        summed = a + 1.0
    assert torch.equal(rounded, precision.round_to_tf32(a) @ precision.round_to_tf32(b))
    assert not torch.equal(rounded, exact)
    assert torch.equal(conv, torch.nn.functional.conv2d(precision.round_to_tf32(a).view(1, 1, 64, 256),
                                                        precision.round_to_tf32(b[:3, :3]).reshape(1, 1, 3, 3)))
    assert torch.equal(summed, a + 1.0)
    with precision.emulated("fp32"):
        assert torch.equal(a @ b, exact)


def test_applied_sets_torch_switches_and_restores_them():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    with precision.applied("tf32"):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with precision.applied("fp32"):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32  # cuDNN's default is on
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_the_policy_reaches_database_keys_of_gpus_not_cpus():
    assert device_key("h100") == "h100:fp32"
    with config.patch(precision="tf32"):
        assert device_key("h100") == "h100:tf32"
        assert device_key("cpu") == device_key("cpu")
    assert not device_key("cpu").endswith("fp32")


def test_unknown_policies_and_tf32_on_a_cpu_are_one_line_errors():
    with pytest.raises(KorchError, match="unknown precision 'fp8'"):
        precision.get("fp8")
    with pytest.raises(KorchError, match="for GPU targets"):
        optimize("zoo:bert_layer", target="cpu", cost="roofline", precision="tf32")
