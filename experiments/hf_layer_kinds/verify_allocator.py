"""Verify: on this torch CPU build every tensor storage is one posix_memalign(numel*itemsize) whose
address == untyped_storage().data_ptr(), freed by free(); 0-element tensors and views allocate nothing.
Usage: python verify_allocator.py"""
import os, tempfile, torch, memray
torch.set_num_threads(1)
AT = memray.AllocatorType
path = os.path.join(tempfile.mkdtemp(), "v.bin")
keep = {}
with memray.Tracker(path, native_traces=False):
    keep["f32_empty[3,5]"] = torch.empty(3, 5)
    keep["bf16_zeros[7]"] = torch.zeros(7, dtype=torch.bfloat16)
    keep["i64_tensor(0)"] = torch.tensor(0, dtype=int)
    keep["bool[9]"] = torch.ones(9, dtype=torch.bool)
    keep["cat f32[6,5]"] = torch.cat([keep["f32_empty[3,5]"], keep["f32_empty[3,5]"]])
    keep["tensor([]) (0 elems)"] = torch.tensor([], dtype=torch.float32)
    keep["view of cat"] = keep["cat f32[6,5]"][2:]
    tmp = torch.randn(11, 13)  # freed inside the tracker
    tmp_ptr = tmp.untyped_storage().data_ptr()
    del tmp
recs = list(memray.FileReader(path).get_allocation_records())
pm = {r.address: r for r in recs if r.allocator == AT.POSIX_MEMALIGN}
frees = {r.address for r in recs if r.allocator == AT.FREE}
other = [(AT(r.allocator).name, r.size) for r in recs if r.allocator in (AT.CALLOC, AT.ALIGNED_ALLOC, AT.MEMALIGN) and r.size >= 8]
for name, t in keep.items():
    p = t.untyped_storage().data_ptr()
    r = pm.get(p)
    print(f"{name:22s} numel*itemsize={t.numel()*t.element_size():5d} storage.nbytes={t.untyped_storage().nbytes():5d}"
          f"  posix_memalign at data_ptr: {'%d B' % r.size if r else 'none'}")
print(f"randn[11,13] (572 B) posix_memalign={pm[tmp_ptr].size if tmp_ptr in pm else None} freed={tmp_ptr in frees}")
print("calloc/aligned_alloc/memalign >= 8 B seen:", other)
