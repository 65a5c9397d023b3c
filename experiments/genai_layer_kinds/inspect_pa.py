"""Inspect stateful export + SDPAToPagedAttention result with the installed OpenVINO (2026.4.1)."""
import sys, numpy as np, openvino as ov
from openvino._offline_transformations import paged_attention_transformation
core = ov.Core()
def const_value(out):
    n = out.get_node()
    if n.get_type_name() == "Constant":
        return n.get_data().tolist()
    # try constant folding of small subgraphs (Multiply/Convert/Squeeze/Subtract of constants)
    try:
        m = ov.Model([n.output(0)], [], "tmp")
        from openvino import Core
        r = core.compile_model(m, "CPU").create_infer_request(); r.infer()
        return r.get_output_tensor(0).data.tolist()
    except Exception as e:
        return f"<{n.get_type_name()}: {e.__class__.__name__}>"
for d in sys.argv[1:]:
    print("=" * 20, d)
    m = core.read_model(d + "/openvino_model.xml")
    # stateful: what feeds each Assign?
    assigns = [op for op in m.get_ops() if op.get_type_name() == "Assign"]
    feeders = {}
    for a in assigns:
        src = a.input_value(0).get_node()
        feeders[src.get_type_name()] = feeders.get(src.get_type_name(), 0) + 1
    print("variables:", len(m.get_variables()), "Assign fed by:", feeders)
    for v in m.get_variables()[:3]:
        print("   var", v.get_info().variable_id, v.get_info().data_shape, v.get_info().data_type)
    paged_attention_transformation(m, False, False)
    pas = [op for op in m.get_ops() if op.get_type_name() == "PagedAttentionExtension"]
    sw = [const_value(p.input_value(10)) for p in pas]
    sinks = [list(p.input_value(20).get_partial_shape()) if p.get_input_size() > 20 else None for p in pas]
    print("PA nodes:", len(pas), "sliding_window per PA:", sw)
    print("sinks input shape per PA:", [str(p.input_value(20).get_partial_shape()) for p in pas])
    ins = [(i.get_any_name(), str(i.get_partial_shape()), str(i.get_element_type())) for i in m.inputs]
    for n, s, t in ins:
        if any(k in n for k in ("key_cache", "value_cache", "state_table", "la.")):
            print("   input", n, s, t)
    cm = core.compile_model(m, "CPU")
    for i in cm.inputs:
        n = i.get_any_name()
        if any(k in n for k in ("key_cache.0", "value_cache.0", "state_table.0", "state_table.1")):
            print("   compiled", n, i.get_partial_shape(), i.get_element_type())
