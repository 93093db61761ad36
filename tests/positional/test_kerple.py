import math

import pytest
import torch
from omegaconf import OmegaConf

from posbench.positional import build_encoding
from posbench.positional.kerple import FLOOR

T = 9


def make(name: str, n_heads: int = 2):
    return build_encoding(
        OmegaConf.create({"name": name}), n_heads=n_heads, head_dim=8, d_model=8 * n_heads, train_len=16
    )


def dense(encoding):
    pos = torch.arange(T)
    return encoding.bias(pos, pos)


def set_params(encoding, **values):
    with torch.no_grad():
        for name, value in values.items():
            getattr(encoding, name).copy_(torch.tensor(value))


def expected_log(r1, r2):
    return torch.tensor(
        [[[-r1[h] * math.log(1 + r2[h] * abs(i - j)) for j in range(T)] for i in range(T)] for h in range(len(r1))]
    )


def expected_power(a, p):
    return torch.tensor([[[-a[h] * abs(i - j) ** p[h] for j in range(T)] for i in range(T)] for h in range(len(a))])


def sgd_step(encoding, loss_sign: float, lr: float = 100.0):
    """One large SGD step on ±(sum of the causal bias), enough to push parameters out of range."""
    optimizer = torch.optim.SGD(encoding.parameters(), lr=lr)
    (loss_sign * dense(encoding).tril().sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_log_kernel_hand_worked():
    encoding = make("kerple_log")
    set_params(encoding, r1=[1.0, 0.5], r2=[1.0, 2.0])
    bias = dense(encoding)
    assert math.isclose(bias[0, 3, 0].item(), -math.log(4), rel_tol=1e-6)
    assert math.isclose(bias[1, 3, 1].item(), -0.5 * math.log(5), rel_tol=1e-6)
    torch.testing.assert_close(bias, expected_log([1.0, 0.5], [1.0, 2.0]))
    scalar = encoding.bias_at(torch.tensor(1), torch.tensor(7), torch.tensor(2))
    assert scalar.shape == () and math.isclose(scalar.item(), -0.5 * math.log(11), rel_tol=1e-6)


def test_power_kernel_hand_worked():
    encoding = make("kerple_power")
    set_params(encoding, a=[1.0, 0.5], p=[1.0, 0.5])
    bias = dense(encoding)
    assert bias[0, 3, 0].item() == -3.0
    assert math.isclose(bias[1, 4, 0].item(), -1.0, rel_tol=1e-6)  # -0.5 * 4^0.5
    torch.testing.assert_close(bias, expected_power([1.0, 0.5], [1.0, 0.5]))


def test_initialised_as_in_the_reference_code():
    torch.manual_seed(0)
    log_kernel, power_kernel = make("kerple_log", n_heads=512), make("kerple_power", n_heads=512)
    for outer in (log_kernel.r1, power_kernel.p):  # U(0, 2)
        assert 0 < outer.min() and outer.max() < 2 and outer.max() > 1.5
    for inner in (log_kernel.r2, power_kernel.a):  # U(0, 1)
        assert 0 < inner.min() and inner.max() < 1 and inner.max() > 0.9


def test_all_parameters_learn_with_finite_gradients():
    for name in ("kerple_log", "kerple_power"):
        encoding = make(name)
        assert not encoding.is_static
        dense(encoding).tril().sum().backward()  # the diagonal (distance 0) included
        for p in encoding.parameters():
            assert torch.isfinite(p.grad).all() and (p.grad != 0).all(), name


def test_gradients_match_the_formula():
    encoding = make("kerple_log")
    set_params(encoding, r1=[1.0, 0.5], r2=[1.0, 2.0])
    dense(encoding).tril().sum().backward()
    distances = [i - j for i in range(T) for j in range(i + 1)]
    # d/dr1 = -sum log(1 + r2 d); d/dr2 = -sum r1 d / (1 + r2 d)
    expected_r1 = [-sum(math.log(1 + r2 * d) for d in distances) for r2 in (1.0, 2.0)]
    expected_r2 = [-sum(r1 * d / (1 + r2 * d) for d in distances) for r1, r2 in ((1.0, 1.0), (0.5, 2.0))]
    torch.testing.assert_close(encoding.r1.grad, torch.tensor(expected_r1))
    torch.testing.assert_close(encoding.r2.grad, torch.tensor(expected_r2))


def test_log_parameters_floored_after_a_step_below_zero():
    encoding = make("kerple_log")
    set_params(encoding, r1=[1.0, 0.5], r2=[1.0, 2.0])
    sgd_step(encoding, loss_sign=-1.0)  # raise the bias: shrink r1 and r2
    assert (encoding.r1 < 0).all() and (encoding.r2 < 0).all()
    torch.testing.assert_close(dense(encoding), expected_log([0.01, 0.01], [0.01, 0.01]))
    assert encoding.r1.tolist() == encoding.r2.tolist() == [pytest.approx(FLOOR)] * 2  # the use reset them
    dense(encoding).tril().sum().backward()  # still learning at the floor
    assert (encoding.r1.grad != 0).all() and (encoding.r2.grad != 0).all()


def test_power_parameters_bounded_after_steps_out_of_range():
    encoding = make("kerple_power")
    set_params(encoding, a=[1.0, 0.5], p=[1.0, 1.5])
    sgd_step(encoding, loss_sign=-1.0)  # raise the bias: shrink a and p
    assert (encoding.a < 0).all() and (encoding.p < 0).all()
    torch.testing.assert_close(dense(encoding), expected_power([0.01, 0.01], [0.01, 0.01]))

    set_params(encoding, a=[1.0, 0.5], p=[1.0, 1.5])
    sgd_step(encoding, loss_sign=1.0, lr=1.0)  # lower the bias: grow a and p
    assert (encoding.p > 2).all()
    a = encoding.a.tolist()
    torch.testing.assert_close(dense(encoding), expected_power(a, [2.0, 2.0]))
    assert encoding.p.tolist() == [2.0, 2.0] and encoding.a.tolist() == a  # stored p reset to its upper bound


def reference_log_kernel_run(r1: list, r2: list, signs: list, lr: float, in_place: bool = True) -> list:
    """The reference's update (chijames/KERPLE, ParallelKerpleLog) written out with Adam: before each
    forward the stored values are clamped (``p.data = p.data.clamp(min=eps)``), then the bias
    -r1·log(1 + r2·d) over the causal distances. ``in_place=False``: the straight-through clamp
    posbench had before, which never resets the stored values. Stored r1 after each forward."""
    r1, r2 = torch.nn.Parameter(torch.tensor(r1)), torch.nn.Parameter(torch.tensor(r2))
    optimizer = torch.optim.Adam([r1, r2], lr=lr)
    d = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0).float()  # 0 above the diagonal
    history = []
    for sign in signs:
        if in_place:
            r1.data, r2.data = r1.data.clamp(min=0.01), r2.data.clamp(min=0.01)
            a, b = r1, r2
        else:
            a, b = (x.detach().clamp(min=0.01) + (x - x.detach()) for x in (r1, r2))
        bias = -a[:, None, None] * torch.log(1 + b[:, None, None] * d)
        history.append(r1.detach().clone())
        (sign * bias.sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return history


def test_a_parameter_pushed_past_its_bound_comes_back_as_in_the_reference():
    """Ten Adam steps push r1 and r2 down past the floor, then the loss pulls them up: the stored values
    sit on the floor after each forward and follow the reference step by step; the reference is back
    above 0.1 within 20 steps of the pull, while the old straight-through clamp is still below the floor."""
    signs, lr = [-1.0] * 10 + [1.0] * 20, 0.1  # -1: raise the bias (shrink r1, r2); +1: lower it
    encoding = make("kerple_log")
    set_params(encoding, r1=[0.3, 1.0], r2=[0.2, 0.5])
    optimizer = torch.optim.Adam(encoding.parameters(), lr=lr)
    stored = []
    for sign in signs:
        bias = dense(encoding)
        stored.append(encoding.r1.detach().clone())
        assert (encoding.r1 >= FLOOR).all() and (encoding.r2 >= FLOOR).all()
        (sign * bias.tril().sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    reference = reference_log_kernel_run([0.3, 1.0], [0.2, 0.5], signs, lr)
    torch.testing.assert_close(torch.stack(stored), torch.stack(reference), rtol=1e-4, atol=1e-6)
    assert stored[9][0].item() == pytest.approx(FLOOR) and stored[-1][0].item() > 0.1  # on the floor, then back
    drifted = reference_log_kernel_run([0.3, 1.0], [0.2, 0.5], signs, lr, in_place=False)
    assert drifted[9][0].item() < -0.2 and drifted[-1][0].item() < FLOOR  # the difference the reference makes


def test_compiled_code_clamps_without_writing_and_keeps_learning():
    """Compiled code (FlexAttention's score_mod) cannot write to a parameter: the same clamped values with
    the identity's gradient there; the next eager use resets the stored values."""
    encoding = make("kerple_log")
    set_params(encoding, r1=[-0.5, 0.5], r2=[1.0, -2.0])
    compiled = torch.compile(lambda: dense(encoding).tril().sum(), backend="eager", fullgraph=True)
    total = compiled()
    assert encoding.r1[0].item() == -0.5 and encoding.r2[1].item() == -2.0  # nothing written
    torch.testing.assert_close(total, expected_log([0.01, 0.5], [1.0, 0.01]).tril().sum())
    total.backward()
    assert (encoding.r1.grad != 0).all() and (encoding.r2.grad != 0).all()
    dense(encoding)
    assert encoding.r1[0].item() == pytest.approx(FLOOR) and encoding.r2[1].item() == pytest.approx(FLOOR)
