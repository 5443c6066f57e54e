"""Model building blocks: norms, rotary embedding, activations, TP linears, MLP, MoE, attention."""
