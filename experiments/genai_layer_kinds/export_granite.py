import os, sys, tempfile, torch, transformers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from optimum.exporters.openvino import main_export
cfg = transformers.GraniteMoeHybridConfig(vocab_size=1000, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, num_local_experts=4, num_experts_per_tok=2,
      shared_intermediate_size=128, layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_heads=8, mamba_d_head=32,
      mamba_d_state=16, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg)
with tempfile.TemporaryDirectory() as src:
    model.save_pretrained(src)
    main_export(src, output=sys.argv[1], task="text-generation-with-past", stateful=True, weight_format="fp32", library_name="transformers")
print("ok")
