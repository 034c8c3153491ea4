//! What the agent installs into the share must run in any sidecar image: distroless, busybox,
//! musl or glibc. Only a static ELF executable for this node's architecture does; a dynamically
//! linked one (what a plain `cargo build` gives) fails in every preStop hook, and the pod then
//! exits unordered with nothing in the agent's log saying why.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read it: {0}")]
    Io(#[from] io::Error),
    #[error("not an ELF executable ({0})")]
    NotElf(&'static str),
    #[error("built for {found}, but this node is {want}")]
    WrongArch { found: String, want: &'static str },
    #[error("dynamically linked (it needs {interp}, which sidecar images may not have)")]
    Dynamic { interp: String },
}

const PT_INTERP: u32 = 3;
const ET_EXEC: u16 = 2;
/// Position-independent executables (static-pie included) are ET_DYN.
const ET_DYN: u16 = 3;

/// The ELF machine of this build's target, and its name.
fn native_machine() -> (u16, &'static str) {
    match std::env::consts::ARCH {
        "x86_64" => (62, "x86_64"),
        "aarch64" => (183, "aarch64"),
        "x86" => (3, "x86"),
        "arm" => (40, "arm"),
        "riscv64" => (243, "riscv64"),
        "s390x" => (22, "s390x"),
        "powerpc64" => (21, "powerpc64"),
        other => (0, other),
    }
}

fn machine_name(m: u16) -> String {
    match m {
        62 => "x86_64".to_owned(),
        183 => "aarch64".to_owned(),
        3 => "x86".to_owned(),
        40 => "arm".to_owned(),
        243 => "riscv".to_owned(),
        22 => "s390".to_owned(),
        21 => "powerpc64".to_owned(),
        other => format!("ELF machine {other}"),
    }
}

/// The parts of an ELF header that decide whether it runs here on its own.
#[derive(Debug)]
struct Header {
    is64: bool,
    little: bool,
    kind: u16,
    machine: u16,
    phoff: u64,
    phentsize: u64,
    phnum: u64,
}

/// `N` bytes of `b` at `at`, or the header is too short for what it claims.
fn field<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], ElfError> {
    at.checked_add(N)
        .and_then(|end| b.get(at..end))
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(ElfError::NotElf("short header"))
}

/// Bytes in the file's order turned into the machine's.
fn order<const N: usize>(mut v: [u8; N], little: bool) -> [u8; N] {
    if little != cfg!(target_endian = "little") {
        v.reverse();
    }
    v
}

fn read_header(f: &mut File) -> Result<Header, ElfError> {
    let mut h = [0u8; 64];
    f.read_exact(&mut h).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => ElfError::NotElf("too short"),
        _ => ElfError::Io(e),
    })?;
    if h.get(..4) != Some(b"\x7fELF".as_slice()) {
        return Err(ElfError::NotElf("bad magic"));
    }
    let little = match h.get(5) {
        Some(1) => true,
        Some(2) => false,
        _ => return Err(ElfError::NotElf("bad byte order")),
    };
    let u16_at = |at: usize| field::<2>(&h, at).map(|v| u16::from_ne_bytes(order(v, little)));
    let u32_at = |at: usize| field::<4>(&h, at).map(|v| u32::from_ne_bytes(order(v, little)));
    let u64_at = |at: usize| field::<8>(&h, at).map(|v| u64::from_ne_bytes(order(v, little)));
    let (is64, phoff, phentsize, phnum) = match h.get(4) {
        Some(2) => (true, u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?),
        Some(1) => (
            false,
            u64::from(u32_at(0x1c)?),
            u16_at(0x2a)?,
            u16_at(0x2c)?,
        ),
        _ => return Err(ElfError::NotElf("bad class")),
    };
    Ok(Header {
        is64,
        little,
        kind: u16_at(0x10)?,
        machine: u16_at(0x12)?,
        phoff,
        phentsize: u64::from(phentsize),
        phnum: u64::from(phnum),
    })
}

/// The program interpreter the file asks for, if any (`PT_INTERP`).
fn interpreter(f: &mut File, h: &Header) -> Result<Option<String>, ElfError> {
    if h.phentsize < 8 || h.phnum > 4096 {
        return Err(ElfError::NotElf("bad program header table"));
    }
    let len = usize::try_from(h.phentsize.saturating_mul(h.phnum))
        .map_err(|_| ElfError::NotElf("program header table too large"))?;
    let entry = usize::try_from(h.phentsize).map_err(|_| ElfError::NotElf("bad entry size"))?;
    f.seek(SeekFrom::Start(h.phoff))?;
    let mut table = vec![0u8; len];
    f.read_exact(&mut table)
        .map_err(|_| ElfError::NotElf("truncated program header table"))?;
    let word =
        |b: &[u8], at: usize| field::<4>(b, at).map(|v| u32::from_ne_bytes(order(v, h.little)));
    let dword =
        |b: &[u8], at: usize| field::<8>(b, at).map(|v| u64::from_ne_bytes(order(v, h.little)));
    for ph in table.chunks_exact(entry) {
        if word(ph, 0)? != PT_INTERP {
            continue;
        }
        // p_offset and p_filesz: where the interpreter's path is, capped to a sane length.
        let (offset, size) = if h.is64 {
            (dword(ph, 0x08)?, dword(ph, 0x20)?)
        } else {
            (u64::from(word(ph, 0x04)?), u64::from(word(ph, 0x10)?))
        };
        let mut path = vec![0u8; usize::try_from(size.min(256)).unwrap_or(256)];
        f.seek(SeekFrom::Start(offset))?;
        let n = f.read(&mut path)?;
        path.truncate(n);
        let text = String::from_utf8_lossy(&path)
            .trim_end_matches('\0')
            .to_owned();
        return Ok(Some(text));
    }
    Ok(None)
}

/// Checks that `path` is an ELF executable for this node's architecture that needs no dynamic
/// loader: the only kind of binary that runs in every sidecar image.
pub fn check_static_executable(path: &Path) -> Result<(), ElfError> {
    let mut f = File::open(path)?;
    let h = read_header(&mut f)?;
    if h.kind != ET_EXEC && h.kind != ET_DYN {
        return Err(ElfError::NotElf("not an executable"));
    }
    let (machine, name) = native_machine();
    let width_ok = h.is64 == (std::mem::size_of::<usize>() == 8);
    if h.machine != machine || !width_ok {
        return Err(ElfError::WrongArch {
            found: format!(
                "{} ({}-bit)",
                machine_name(h.machine),
                if h.is64 { 64 } else { 32 }
            ),
            want: name,
        });
    }
    if let Some(interp) = interpreter(&mut f, &h)? {
        return Err(ElfError::Dynamic { interp });
    }
    Ok(())
}

/// Whether `path` is an ELF file without a dynamic loader (any architecture); an error when
/// it is not an ELF file at all.
pub fn is_static_elf(path: &Path) -> Result<bool, ElfError> {
    let mut f = File::open(path)?;
    let h = read_header(&mut f)?;
    Ok(interpreter(&mut f, &h)?.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_refused_with_its_loader() {
        // The test binary itself is dynamically linked.
        let me = std::env::current_exe().unwrap();
        match check_static_executable(&me) {
            Err(ElfError::Dynamic { interp }) => assert!(interp.contains("ld"), "{interp}"),
            other => panic!("{other:?}"),
        }
        assert!(!is_static_elf(&me).unwrap());
    }

    #[test]
    fn scripts_and_short_files_are_not_elf() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("script");
        std::fs::write(&script, "#!/bin/sh\necho a script, not an ELF executable\n").unwrap();
        assert!(matches!(
            check_static_executable(&script),
            Err(ElfError::NotElf(_))
        ));
        let short = dir.path().join("short");
        std::fs::write(&short, b"\x7fELF").unwrap();
        assert!(matches!(
            check_static_executable(&short),
            Err(ElfError::NotElf("too short"))
        ));
        assert!(matches!(
            check_static_executable(&dir.path().join("absent")),
            Err(ElfError::Io(_))
        ));
    }

    #[test]
    fn another_architecture_is_refused() {
        let me = std::env::current_exe().unwrap();
        let mut bytes = std::fs::read(me).unwrap();
        // Patch e_machine to one no build of this test targets alongside its own.
        let other: u16 = if native_machine().0 == 183 { 62 } else { 183 };
        let v = if bytes[5] == 1 {
            other.to_le_bytes()
        } else {
            other.to_be_bytes()
        };
        bytes[0x12..0x14].copy_from_slice(&v);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("foreign");
        std::fs::write(&path, bytes).unwrap();
        match check_static_executable(&path) {
            Err(ElfError::WrongArch { want, .. }) => assert_eq!(want, native_machine().1),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_static_busybox_passes() {
        // Present wherever the end-to-end tests run (busybox-static).
        let bb = Path::new("/bin/busybox");
        if crate::handshake::elf::is_static_elf(bb).unwrap_or(false) {
            check_static_executable(bb).unwrap();
        }
    }
}
