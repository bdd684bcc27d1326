//! The harness's heap, made to behave as a long-running writer's does.
//!
//! The in-memory stores keep every byte a cell writes. Left alone, each cell
//! writes into pages fresh from the kernel, one page fault and one zeroed
//! page per 4 KiB; on the benchmark machine (a VM) the kernel's page clearing
//! was 55 % of the process's CPU in a 30,000 records/s Chorus cell. And
//! mimalloc hands freed memory back to the kernel 10 ms after a cell drops
//! its stores, so the next cell pays again. A writer in production reuses the
//! buffers of finished uploads instead. So before the first cell the harness
//! touches a heap as large as a cell needs and keeps freed memory for reuse.
//! This helps the systems that copy records into new buffers (Chorus,
//! SlateDB); the naive log stores clones of one record and allocates next to
//! nothing.

/// mimalloc's `mi_option_purge_delay` (position 15 of `mi_option_e` in
/// `mimalloc.h`, v3, which the bindings do not name): milliseconds before
/// freed memory goes back to the kernel, -1 for never.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sizes of the allocations warmed, half the heap each: a fragment's
/// (Chorus's default 4 MiB, the buffers its in-memory replicas keep) and a
/// sealed segment's (64 MiB, the one size warmed before, kept for systems
/// that allocate in large blocks). mimalloc
/// reuses freed memory for allocations of about the size it was freed at:
/// a heap warmed only in 64 MiB blocks left every 4 MiB fragment on fresh
/// pages, faulted in on the writer's own thread (p99 at 100,000 records/s
/// 47–58 ms instead of 20 ms).
const CHUNK_BYTES: [usize; 2] = [4 << 20, 64 << 20];

/// Keeps freed memory in the process for reuse from now on, then touches
/// `mib` MiB of heap and frees it, so the cells after it write into pages
/// the process already holds. Meant for the `chorus-bench` binary, whose
/// global allocator is mimalloc; under another allocator the option is moot.
pub fn retain_and_warm(mib: u64) {
    // SAFETY: sets a process-wide allocator option; mimalloc reads it on
    // each purge decision and allows changing it at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    let half = (mib << 20) / CHUNK_BYTES.len() as u64;
    let chunks: Vec<Vec<u8>> = CHUNK_BYTES
        .iter()
        .flat_map(|&size| (0..half.div_ceil(size as u64)).map(move |_| vec![1u8; size]))
        .collect();
    drop(std::hint::black_box(chunks));
}
