"""Stateful (non-PA) export of a sliding-window model: does the KV state keep every token or only the window?"""
import sys, numpy as np, openvino as ov
core = ov.Core()
m = core.read_model(sys.argv[1] + "/openvino_model.xml")
cm = core.compile_model(m, "CPU")
r = cm.create_infer_request()
names = [i.get_any_name() for i in cm.inputs]
L = int(sys.argv[2])
feed = {"input_ids": np.arange(5, 5 + L, dtype=np.int64).reshape(1, -1) % 900 + 5,
        "attention_mask": np.ones((1, L), dtype=np.int64),
        "beam_idx": np.zeros((1,), dtype=np.int32)}
if "position_ids" in names:
    feed["position_ids"] = np.arange(L, dtype=np.int64).reshape(1, -1)
r.infer(feed)
for st in r.query_state()[:4]:
    print(st.name[:60], st.state.shape)
# one decode step
feed2 = {"input_ids": np.array([[7]], dtype=np.int64), "attention_mask": np.ones((1, L + 1), dtype=np.int64), "beam_idx": np.zeros((1,), dtype=np.int32)}
if "position_ids" in names:
    feed2["position_ids"] = np.array([[L]], dtype=np.int64)
r.infer(feed2)
print("after 1 decode step:", sorted(set(tuple(st.state.shape) for st in r.query_state())))
