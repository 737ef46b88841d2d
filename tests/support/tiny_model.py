"""A tiny Llama config for forwards checked against each other (``fewrows`` against the eager
layers, packed against padded): small enough to build in milliseconds, with grouped-query
attention and a tied embedding (read from the head's W.T, as SmolLM's)."""

TINY_TIED = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 120,
    "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}


def prefilled(prompts: list[list[int]], max_len: int = 64):
    """A float32 tree model of ``TINY_TIED`` on the CPU (seed 0), a slot per prompt, each
    prompt prefilled into its slot."""
    import torch

    from batchspec.engines.tree.model import TreeModel

    torch.manual_seed(0)
    model = TreeModel.random(TINY_TIED, torch.float32, "cpu", len(prompts), max_len)
    for slot, prompt in enumerate(prompts):
        model.prefill(slot, prompt)
    return model
