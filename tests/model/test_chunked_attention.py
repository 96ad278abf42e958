"""Chunked attention (CPU training) computes what `scaled_dot_product_attention` computes, in
values and in the gradient of the fused qkv projection, and serves only the calls it is for.

Tolerance: 1e-12 in float64 (the same sums in another order).
"""

import pytest
import torch
import torch.nn.functional as F

import vitkit.model.chunked_attention as chunked
import vitkit.model.layers
from vitkit.model.chunked_attention import chunked_attention, use_chunked_attention
from vitkit.model.layers import Attention


def sdpa_reference(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    batch, tokens, width3 = qkv.shape
    q, k, v = qkv.view(batch, tokens, 3, num_heads, width3 // 3 // num_heads
                       ).permute(2, 0, 3, 1, 4).unbind(0)
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(batch, tokens, -1)


@pytest.mark.parametrize("batch,heads,tokens,head_dim", [(7, 3, 5, 4), (33, 4, 65, 12),
                                                          (2, 12, 197, 8), (1, 1, 1, 8),
                                                          (3, 2, 9, 32)])
@pytest.mark.parametrize("chunk_elements", [1 << 19, 100])  # one chunk; many, and a remainder
@pytest.mark.parametrize("transposed_below", [0, 1000])  # each layout for every shape
def test_chunked_attention_equals_sdpa_in_values_and_gradients(
        monkeypatch, batch, heads, tokens, head_dim, chunk_elements, transposed_below):
    monkeypatch.setattr(chunked, "CHUNK_ELEMENTS", chunk_elements)
    monkeypatch.setattr(chunked, "TRANSPOSED_BELOW", transposed_below)
    torch.manual_seed(0)
    qkv = torch.randn(batch, tokens, 3 * heads * head_dim, dtype=torch.float64,
                      requires_grad=True)
    grad_out = torch.randn(batch, tokens, heads * head_dim, dtype=torch.float64)
    expected = sdpa_reference(qkv, heads)
    (expected_grad,) = torch.autograd.grad(expected, qkv, grad_out)
    assert use_chunked_attention(qkv, heads, 0.0)
    before = qkv.detach().clone()
    out = chunked_attention(qkv, heads)
    (grad,) = torch.autograd.grad(out, qkv, grad_out)
    assert out.shape == expected.shape
    assert (out - expected).abs().max() < 1e-12
    assert (grad - expected_grad).abs().max() < 1e-12
    assert torch.equal(qkv.detach(), before)  # q is scaled in a copy, not in the input


def test_narrow_heads_take_the_transposed_layout():
    assert chunked._Layout(4, 12).transposed, "the tutorial's head dim 12"
    assert not chunked._Layout(4, 32).transposed, "the cifar10 recipe's head dim 32"


def test_chunked_attention_takes_a_non_contiguous_projection():
    base = torch.randn(4, 9, 3 * 16 * 2, dtype=torch.float64)[:, :, ::2].requires_grad_()
    expected = sdpa_reference(base, 2)
    out = chunked_attention(base, 2)
    assert (out - expected).abs().max() < 1e-12
    grad_out = torch.randn_like(out)
    assert (torch.autograd.grad(out, base, grad_out)[0]
            - torch.autograd.grad(expected, base, grad_out)[0]).abs().max() < 1e-12


def test_chunked_attention_serves_cpu_training_only():
    qkv = torch.randn(2, 10, 24, requires_grad=True)
    assert use_chunked_attention(qkv, 2, 0.0)
    assert not use_chunked_attention(qkv, 2, 0.1), "attention dropout keeps SDPA"
    assert not use_chunked_attention(qkv.detach(), 2, 0.0), "no backward pass: SDPA"
    with torch.no_grad():
        assert not use_chunked_attention(qkv, 2, 0.0)
    assert not use_chunked_attention(qkv.bfloat16(), 2, 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not use_chunked_attention(qkv, 2, 0.0)
    long = torch.randn(1, chunked.MAX_TOKENS + 1, 24, requires_grad=True)
    assert not use_chunked_attention(long, 2, 0.0)
    wide = torch.randn(2, 10, 3 * 2 * (chunked.MAX_HEAD_DIM + 1), requires_grad=True)
    assert not use_chunked_attention(wide, 2, 0.0), "wide heads keep SDPA"


def test_attention_module_trains_the_same_with_and_without_the_chunked_path(monkeypatch):
    torch.manual_seed(1)
    module = Attention(24, 3).double().train()
    x = torch.randn(5, 17, 24, dtype=torch.float64, requires_grad=True)
    out, _ = module(x)
    grads = torch.autograd.grad(out.square().sum(), [x, *module.parameters()])
    calls = []
    monkeypatch.setattr(vitkit.model.layers, "use_chunked_attention",
                        lambda qkv, num_heads, dropout, training: calls.append(1) and False)
    reference, _ = module(x)
    reference_grads = torch.autograd.grad(reference.square().sum(), [x, *module.parameters()])
    assert calls, "the module asks use_chunked_attention"
    assert (out - reference).abs().max() < 1e-12
    for grad, reference_grad in zip(grads, reference_grads, strict=True):
        assert (grad - reference_grad).abs().max() < 1e-10


class Wrapped(torch.nn.Module):
    """A replaced qkv projection (as adapters or int8 layers do): not an nn.Linear."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.inner = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def test_forward_first_equals_the_full_attention_for_a_linear_or_replaced_projection():
    torch.manual_seed(2)
    module = Attention(24, 3).double().eval()
    x = torch.randn(3, 11, 24, dtype=torch.float64)
    full = module(x)[0][:, :2]
    assert (module.forward_first(x, 2) - full).abs().max() < 1e-12
    module.qkv = Wrapped(module.qkv)
    assert (module.forward_first(x, 2) - full).abs().max() < 1e-12


def test_the_chunked_attention_op_passes_torch_library_checks():
    """Schema, autograd registration and the shapes `torch.compile` traces with (several chunks
    and a remainder)."""
    qkv = torch.randn(5, 9, 3 * 2 * 4, dtype=torch.float64, requires_grad=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunked, "CHUNK_ELEMENTS", 2 * 2 * 9 * 9)  # chunks of 2 samples
        torch.library.opcheck(torch.ops.vitkit.chunked_attention.default, (qkv, 2),
                              test_utils=("test_schema", "test_autograd_registration",
                                          "test_faketensor"))


def compiled_graphs(module: torch.nn.Module, x: torch.Tensor, dynamic: bool
                    ) -> tuple[torch.Tensor, str]:
    """`module(x)` under torch.compile with a backend that keeps the traced graphs as text."""
    graphs = []

    def keep_graph(graph_module, example_inputs):
        graphs.append(str(graph_module.graph))
        return graph_module.forward

    torch._dynamo.reset()
    out, _ = torch.compile(module, backend=keep_graph, dynamic=dynamic)(x)
    return out, "\n".join(graphs)


def test_compile_traces_the_chunked_attention_as_one_op_with_eager_values_and_gradients():
    torch.manual_seed(0)
    module = Attention(24, 3).double().train()
    x = torch.randn(5, 17, 24, dtype=torch.float64, requires_grad=True)
    expected, _ = module(x)
    expected_grad = torch.autograd.grad(expected.square().sum(), x)[0]
    for dynamic in (False, True):  # dynamic: the op's chunks specialise the batch size
        out, graphs = compiled_graphs(module, x, dynamic)
        assert "vitkit.chunked_attention" in graphs
        assert "scaled_dot_product_attention" not in graphs
        assert (out - expected).abs().max() < 1e-12
        grad = torch.autograd.grad(out.square().sum(), x)[0]
        assert (grad - expected_grad).abs().max() < 1e-12
    torch._dynamo.reset()


def test_torch_func_and_export_of_a_small_model_leave_the_chunked_path():
    """Under torch.func (`jacrev`, per-sample `vmap(grad)`) and `torch.export` the model
    takes SDPA, not vitkit's chunked op (which has no torch.func rules), so they work and the
    exported graph holds no vitkit op; training otherwise still takes the chunked path."""

    from torch.func import functional_call, grad, jacrev, vmap

    from vitkit import create_model

    torch.manual_seed(0)
    model = create_model("cifar10-tutorial", depth=1).eval()
    images = torch.randn(3, 3, 32, 32)
    saliency = jacrev(lambda x: model(x[None])[0])(images[0])  # (classes, 3, 32, 32)
    x = images[:1].clone().requires_grad_(True)
    model(x)[0, 2].backward()
    assert torch.allclose(saliency[2], x.grad[0], atol=1e-6)

    model.train()
    params = {name: p.detach() for name, p in model.named_parameters()}
    targets = torch.tensor([1, 4, 7])

    def loss(p, image, target):
        logits = functional_call(model, p, (image[None],))
        return F.cross_entropy(logits, target[None])

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, images, targets)
    for i in range(3):
        model.zero_grad()
        F.cross_entropy(model(images[i:i + 1]), targets[i:i + 1]).backward()
        reference = model.patch_embed.proj.weight.grad
        assert torch.allclose(per_sample["patch_embed.proj.weight"][i], reference,
                              atol=1e-5, rtol=1e-3)

    with torch.no_grad():
        expected = model.eval()(images)
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(model, (images,), dynamic_shapes=({0: batch},))
    assert "vitkit" not in str(program.graph)
    assert torch.allclose(program.module()(torch.cat([images, images])),
                          torch.cat([expected, expected]), atol=1e-5)
    assert use_chunked_attention(torch.randn(2, 65, 144, requires_grad=True), 4, 0.0, True)
    assert not use_chunked_attention(torch.randn(2, 65, 144, requires_grad=True), 4, 0.0,
                                     False), "an eval-mode module keeps SDPA"
