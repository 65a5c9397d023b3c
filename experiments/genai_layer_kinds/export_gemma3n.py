import os, sys, tempfile, torch, transformers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from optimum.exporters.openvino import main_export
cfg = transformers.Gemma3nTextConfig(vocab_size=1000, vocab_size_per_layer_input=1000, hidden_size=128, hidden_size_per_layer_input=16,
      intermediate_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=64,
      num_kv_shared_layers=2, layer_types=["sliding_attention"]*2 + ["full_attention"] + ["sliding_attention"]*2 + ["full_attention"],
      activation_sparsity_pattern=[0.0]*6, max_position_embeddings=4096, laurel_rank=8, altup_num_inputs=4)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(cfg)
with tempfile.TemporaryDirectory() as src:
    model.save_pretrained(src)
    main_export(src, output=sys.argv[1], task="text-generation-with-past", stateful=True, weight_format="fp32", library_name="transformers")
print("ok")
