//! Confinement of tool processes (issue 13, `docs/sandbox.md`): what the kernel offers
//! ([`probe`]), and the steps a tool process takes before it runs its command.
//!
//! STUB: [`probe`] reports nothing available yet; the namespaces and Landlock steps land with
//! the sandbox work.

/// What the kernel lets drover do, found once at daemon start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelSupport {
    /// A new user and mount namespace can be made by this process's children.
    pub namespaces: bool,
    /// The Landlock ABI version, if the kernel has Landlock.
    pub landlock_abi: Option<u32>,
    /// Why a layer is missing (empty when both work).
    pub problems: Vec<String>,
}

/// Finds what the kernel offers. Cheap enough to call once at start; never panics.
pub fn probe() -> KernelSupport {
    KernelSupport {
        namespaces: false,
        landlock_abi: None,
        problems: vec!["the sandbox is not built yet".to_string()],
    }
}
