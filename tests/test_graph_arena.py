"""accel/graph_arena.py: what the vectorized executor keeps across rounds for its CUDA-graph steps, on
fixed tensors (the executor's use of it is checked end to end in tests/test_cuda_graphs.py)."""

from __future__ import annotations

import functools

import torch

from autofl.accel.graph_arena import RoundArena, loss_holds


def same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def test_a_round_s_values_go_into_the_kept_tensor_and_a_shared_tensor_is_copied_never_written():
    arena = RoundArena()
    stack = torch.zeros(3, 2)
    assert arena.stacked("model.w", True, stack) is stack  # a new stack: kept itself
    again = arena.stacked("model.w", True, torch.ones(3, 2))
    assert again is stack and torch.equal(stack, torch.ones(3, 2))
    other = arena.stacked("model.w", True, torch.ones(4, 2))  # another shape: a tensor of its own
    assert other is not stack and other.shape == (4, 2)
    shared = torch.full((2,), 5.0)  # the received global model's tensor: the arena keeps a copy
    kept = arena.stacked("glob.w", False, shared)
    assert kept is not shared and torch.equal(kept, shared)
    assert arena.stacked("glob.w", False, torch.full((2,), 7.0)) is kept
    assert torch.equal(shared, torch.full((2,), 5.0)) and torch.equal(kept, torch.full((2,), 7.0))
    assert arena.row_view("model.w", other) is arena.row_view("model.w", other)
    flag = arena.flag("has_prev", torch.tensor([0.0, 1.0]))
    assert arena.flag("has_prev", torch.tensor([1.0, 1.0])) is flag and flag.tolist() == [1.0, 1.0]


def test_a_kept_sgd_is_reset_so_its_next_step_is_a_fresh_one_s_and_other_settings_get_the_fresh_one():
    arena = RoundArena()
    w = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
    grads = [torch.tensor([0.3, 0.1, -0.2], dtype=torch.float64), torch.tensor([0.5, -0.7, 0.9], dtype=torch.float64)]

    def sgd(**kw):
        return torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01, **kw)

    first = arena.optimizer("u", sgd())
    for g in grads:  # round 1: momentum accumulates
        w.grad = g.clone()
        first.step()
    start = w.clone()
    kept = arena.optimizer("u", sgd())
    assert kept is first
    for g in grads:  # round 2 on the kept optimizer ...
        w.grad = g.clone()
        kept.step()
    reused = w.clone()
    w.copy_(start)
    fresh = sgd()
    for g in grads:  # ... equals round 2 on a new one, bit for bit
        w.grad = g.clone()
        fresh.step()
    assert torch.equal(reused, w)
    assert arena.optimizer("u", sgd(dampening=0.5)) is not first  # 0 * momentum + (1 - d) * d_p is no clone
    assert arena.optimizer("u", torch.optim.SGD([w], lr=0.2, momentum=0.9, weight_decay=0.01)) is not first
    assert arena.optimizer("u", torch.optim.SGD([w.clone()], lr=0.1)) is not first


class Method:
    def __init__(self) -> None:
        self.lam = 0.5

    def loss(self, x):
        return self.lam * x


class CallableLoss:
    def __init__(self) -> None:
        self.protos = torch.ones(2)

    def __call__(self, x):
        return x - self.protos


def make_closure(protos, lam):
    def loss(x):
        return lam * (x - protos)

    return loss


def test_a_loss_made_again_over_the_same_values_is_the_same_and_over_new_ones_is_another():
    method, protos, lam = Method(), torch.zeros(2), 0.25
    assert same(loss_holds(method.loss), loss_holds(method.loss))  # a new bound method object each access
    before = loss_holds(method.loss)
    method.lam = 0.75  # an attribute it reads, reassigned
    assert not same(before, loss_holds(method.loss))
    assert same(loss_holds(make_closure(protos, lam)), loss_holds(make_closure(protos, lam)))
    assert not same(loss_holds(make_closure(protos, lam)), loss_holds(make_closure(torch.zeros(2), lam)))
    assert same(loss_holds(functools.partial(make_closure, protos)),
                loss_holds(functools.partial(make_closure, protos)))
    assert not same(loss_holds(functools.partial(make_closure, protos)),
                    loss_holds(functools.partial(make_closure, torch.zeros(2))))
    assert not same(loss_holds(functools.partial(make_closure, protos=protos)),
                    loss_holds(functools.partial(make_closure, lam=protos)))  # another keyword
    callable_object = CallableLoss()
    before = loss_holds(callable_object)
    assert same(before, loss_holds(callable_object))
    callable_object.protos = torch.zeros(2)  # replaced: another key
    assert not same(before, loss_holds(callable_object))
    held = {"protos": protos}  # a container a closure reads: its items are part of the key
    before = loss_holds(make_closure(held, lam))
    held["protos"] = torch.zeros(2)
    assert not same(before, loss_holds(make_closure(held, lam)))
    module = torch.nn.Linear(2, 2)  # a module's parameters and buffers too
    before = loss_holds(make_closure(module, lam))
    module.weight = torch.nn.Parameter(torch.zeros(2, 2))
    assert not same(before, loss_holds(make_closure(module, lam)))


def test_a_closure_over_a_round_s_tensors_runs_on_the_arena_s_copies_which_the_next_round_s_values_fill():
    arena = RoundArena()
    protos1, protos2 = torch.tensor([1.0, 2.0]), torch.tensor([5.0, 7.0])
    first = arena.loss("u", make_closure(protos1, 0.25))
    assert first(torch.zeros(2)).tolist() == [-0.25, -0.5]
    second = arena.loss("u", make_closure(protos2, 0.25))  # the next round's: the same code, other values
    assert second is first and second(torch.zeros(2)).tolist() == [-1.25, -1.75]
    assert protos1.tolist() == [1.0, 2.0]  # the round's own tensors are never written
    assert same(loss_holds(first), loss_holds(second))
    # another scalar, another shape: a closure of its own
    assert arena.loss("u", make_closure(protos2, 0.5)) is not first
    other = arena.loss("u", make_closure(torch.zeros(3), 0.5))
    assert other(torch.ones(3)).tolist() == [0.5, 0.5, 0.5]
    # nothing to keep: a function without tensors in its cells, a bound method, a tensor that needs grad
    assert arena.loss("v", make_closure) is make_closure
    no_tensors = make_closure(None, 0.25)
    assert arena.loss("v", no_tensors) is no_tensors
    method = Method()
    assert arena.loss("v", method.loss) == method.loss
    trained = torch.zeros(2, requires_grad=True)
    needs_grad = make_closure(trained, 0.25)
    assert arena.loss("w", needs_grad) is needs_grad
