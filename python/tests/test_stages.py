"""skyhive.stages: a registry model's layers, as a pipeline splits them, compose to its twin."""

import torch

from skyhive import models, stages


def test_gpt_layers_compose_to_the_twin():
    torch.manual_seed(3)
    spec = "gpt-mini:300x16"
    entries = stages.layers(spec)
    twin = models.build(spec, untied=True)
    # The layers carry the Go model's names; give them the twin's weights.
    by_name = dict(twin.skyhive_parameters())
    with torch.no_grad():
        for module, names in entries:
            for name, p in zip(names, module.parameters()):
                p.copy_(by_name[name])
    assert sorted(n for _, ns in entries for n in ns) == sorted(by_name)
    assert len(entries) == 4 + 4 + 1  # tokens, positions, dropout, 4 blocks, LayerNorm, head
    ids = torch.randint(0, 300, (3, 16))
    x = ids.float()  # the pipeline's tensors are float32
    for module, _ in entries:
        x = module(x)
    assert torch.allclose(x, twin(ids), atol=1e-6)


def test_mlp_layers_are_the_twins():
    entries = stages.layers("mlp-small")
    twin = models.build("mlp-small")
    assert [n for _, ns in entries for n in ns] == [n for n, _ in twin.skyhive_parameters()]
