"""Every limit on what ckpt-ha reads from a checkpoint, in one place.

A checkpoint folder is input from a training job, so each reader is bounded in the bytes it
reads, the memory it builds and the time it spends; input past a limit is a verdict
(``corrupt``, ``incomplete`` or ``unsafe`` with a reason naming the limit), never an exception
and never a size above which a safety check is skipped. The event contracts have their own
bounds (`ckpt_ha.contracts.bounds`); ``docs/SECURITY.md`` lists both.

JSON files (every one goes through `jsondoc.parse`)

==================================  ===============  ==========================================
limit                               value            past it
==================================  ===============  ==========================================
`MAX_MANIFEST_BYTES`                16 MiB           native manifest: corrupt
`MAX_SIDECAR_BYTES`                 16 MiB           identity / commit sidecar: invalid
                                                     (corrupt; an intent: identity unknown)
`MAX_TRAINER_JSON_BYTES`            64 MiB           ``trainer_state.json``, ``config.json``:
                                                     corrupt
`MAX_INDEX_BYTES`                   64 MiB           ``*.safetensors.index.json``: corrupt
`MAX_SAFETENSORS_HEADER_BYTES`      100,000,000 B    a safetensors header (the library's own
                                                     limit): corrupt
`MAX_MARKER_BYTES`                  16 MiB           the writer-watcher reads no larger commit
                                                     marker (the folder waits for verification)
`MAX_JSON_DEPTH`                    200 levels       any JSON document: corrupt
`MAX_JSON_INT_DIGITS`               4,300 digits     any JSON number: corrupt (Python's own
                                                     limit on int/str conversion)
`MAX_SAFE_INT`                      2**53 - 1        steps, sizes, offsets, tensor dimensions
                                                     read from a file: corrupt
`MAX_TENSOR_DIMS`                   64               a safetensors tensor's shape: corrupt
==================================  ===============  ==========================================

Pickles (never unpickled unrestricted: `restricted_pickle`)

==================================  ===============  ==========================================
limit                               value            past it
==================================  ===============  ==========================================
`MAX_METADATA_BYTES`                64 MiB           DCP ``.metadata``: corrupt (a real one
                                                     costs ~24 estimated bytes per byte and
                                                     ~0.5 opcode per byte, so the two limits
                                                     below pass at ~30 MiB, ~200,000 chunks)
`MAX_PICKLE_BYTES`                  64 MiB           the pickle in a torch file (``data.pkl``
                                                     of its zip, or a legacy file's pickles):
                                                     corrupt
`MAX_PICKLE_OPS`                    16,000,000       opcodes in one pickle: corrupt
`MAX_PICKLE_BUILD_BYTES`            768 MiB          estimated memory of what one pickle
                                                     builds (each opcode's worst case): corrupt
`MAX_PICKLE_MEMO`                   4,000,000        memo index (the unpickler allocates up to
                                                     twice the index): corrupt
`MAX_PICKLE_STRING_BYTES`           16 MiB           one string or bytes value: corrupt
`MAX_PICKLE_INT_BYTES`              1 KiB            one binary integer (a decimal one: 4,300
                                                     digits): corrupt
(allow-list)                        per format       any global outside it: unsafe
`MAX_TORCH_ZIP_DIRECTORY_BYTES`     64 MiB           bytes read from a torch zip besides the
                                                     pickle (its directory, headers): corrupt
`MAX_LOAD_BYTES`                    1 GiB            the extra ``torch.load(weights_only=True)``
                                                     run only up to it (memory); the pickle is
                                                     checked at every size
==================================  ===============  ==========================================

Reports: at most `MAX_REASONS` reasons are kept (then one saying how many more), each at most
`MAX_REASON_CHARS` characters: a verdict on a hostile header with a million bad tensors stays
small enough for an event.
"""

from __future__ import annotations

MAX_SAFE_INT = 2**53 - 1
"""The same bound the event contracts put on steps and sizes (`ckpt_ha.contracts.bounds`)."""

MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_SIDECAR_BYTES = 16 * 1024 * 1024
MAX_TRAINER_JSON_BYTES = 64 * 1024 * 1024
MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000
MAX_MARKER_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 200
MAX_JSON_INT_DIGITS = 4300
MAX_TENSOR_DIMS = 64

MAX_METADATA_BYTES = 64 * 1024 * 1024
MAX_PICKLE_BYTES = 64 * 1024 * 1024
MAX_PICKLE_OPS = 16_000_000
MAX_PICKLE_BUILD_BYTES = 768 * 1024 * 1024
MAX_PICKLE_MEMO = 4_000_000
MAX_PICKLE_STRING_BYTES = 16 * 1024 * 1024
MAX_PICKLE_INT_BYTES = 1024
MAX_TORCH_ZIP_DIRECTORY_BYTES = 64 * 1024 * 1024
MAX_LOAD_BYTES = 1024 * 1024 * 1024

MAX_REASONS = 100
MAX_REASON_CHARS = 1000
