//! What Rust's std would supply to the binary: the C library to link, a
//! memory allocator and, in release builds, what a panic does.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

// std links the C library and libgcc's unwinder; without std the binary says
// so itself. The unwinder is never used to unwind (panics abort), but the
// precompiled core and alloc libraries, and a static glibc's thread
// cancellation, refer to it. As std does: libgcc_eh when linking statically,
// libgcc_s otherwise.
#[link(name = "c")]
extern "C" {}
#[cfg(target_feature = "crt-static")]
#[link(name = "gcc_eh", kind = "static")]
extern "C" {}
#[cfg(not(target_feature = "crt-static"))]
#[link(name = "gcc_s")]
extern "C" {}

#[global_allocator]
static ALLOCATOR: Malloc = Malloc;

/// The C library's malloc, which std's `System` allocator uses too.
struct Malloc;

/// The alignment malloc guarantees on x86_64 and aarch64 glibc.
const MALLOC_ALIGN: usize = 16;

// SAFETY: malloc, realloc and posix_memalign return memory that is suitably
// aligned for the layout (the larger alignments go through posix_memalign)
// or null, and free/realloc only ever get pointers those returned.
unsafe impl GlobalAlloc for Malloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN && layout.align() <= layout.size() {
            // SAFETY: see the impl.
            unsafe { libc::malloc(layout.size()).cast() }
        } else {
            let mut out: *mut c_void = core::ptr::null_mut();
            // posix_memalign wants at least pointer alignment.
            let align = layout.align().max(core::mem::size_of::<usize>());
            // SAFETY: see the impl; out is only read when the call succeeded.
            match unsafe { libc::posix_memalign(&mut out, align, layout.size()) } {
                0 => out.cast(),
                _ => core::ptr::null_mut(),
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: see the impl.
        unsafe { libc::free(ptr.cast()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= MALLOC_ALIGN && layout.align() <= new_size {
            // SAFETY: see the impl.
            unsafe { libc::realloc(ptr.cast(), new_size).cast() }
        } else {
            // SAFETY: the caller's guarantees for realloc cover the default,
            // allocate-copy-free implementation.
            unsafe { realloc_by_copy(self, ptr, layout, new_size) }
        }
    }
}

/// GlobalAlloc's default realloc, for alignments malloc does not give.
///
/// # Safety
///
/// As for [`GlobalAlloc::realloc`].
unsafe fn realloc_by_copy(
    allocator: &Malloc,
    ptr: *mut u8,
    layout: Layout,
    new_size: usize,
) -> *mut u8 {
    let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
        return core::ptr::null_mut();
    };
    // SAFETY: new_layout has a non-zero size (the caller's guarantee).
    let new = unsafe { allocator.alloc(new_layout) };
    if !new.is_null() {
        // SAFETY: both blocks are valid for the smaller of the two sizes and
        // are distinct allocations.
        unsafe {
            core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
            allocator.dealloc(ptr, layout);
        }
    }
    new
}

/// A panic is a bug: say where on stderr, then abort, as a panic in a
/// release build with std does (minus the backtrace).
#[cfg(panic = "abort")]
#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    use core::sync::atomic::{AtomicBool, Ordering};
    use exitorder_entrypoint::{log, sys};
    // A panic while reporting a panic must not recurse.
    static PANICKING: AtomicBool = AtomicBool::new(false);
    if !PANICKING.swap(true, Ordering::Relaxed) {
        log!("{info}");
    }
    sys::abort()
}

/// Referenced by the precompiled `core` library, which is built for
/// unwinding; never called, as release builds abort on panic.
#[cfg(panic = "abort")]
#[no_mangle]
extern "C" fn rust_eh_personality() {}
