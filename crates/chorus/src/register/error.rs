//! Errors of the register layer.

use super::manifest::readable_formats_text;
use crate::blob::Source;
use crate::codec::NewerFormat;

/// A register store call failed.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The document is no longer at the version the update named.
    #[error("register version conflict: register={register}")]
    Conflict {
        /// Register name.
        register: String,
    },
    /// A create found the register already there.
    #[error("register already exists: register={register}")]
    AlreadyExists {
        /// Register name.
        register: String,
    },
    /// Transient; the call may have applied. Re-read and re-decide.
    #[error("register unavailable: register={register}: {source}")]
    Unavailable {
        /// Register name.
        register: String,
        /// What went wrong.
        source: Source,
    },
    /// Terminal: misconfiguration, permissions, a stored document that is not
    /// a register, or a document beyond the backend's capacity.
    #[error("register error: register={register}: {source}")]
    Backend {
        /// Register name.
        register: String,
        /// What went wrong.
        source: Source,
    },
}

impl RegisterError {
    /// Whether retrying (after re-reading) may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, RegisterError::Unavailable { .. })
    }

    pub(crate) fn unavailable(register: &str, source: impl Into<Source>) -> RegisterError {
        RegisterError::Unavailable {
            register: register.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn backend(register: &str, source: impl Into<Source>) -> RegisterError {
        RegisterError::Backend {
            register: register.to_owned(),
            source: source.into(),
        }
    }

    pub(crate) fn conflict(register: &str) -> RegisterError {
        RegisterError::Conflict {
            register: register.to_owned(),
        }
    }

    pub(crate) fn already_exists(register: &str) -> RegisterError {
        RegisterError::AlreadyExists {
            register: register.to_owned(),
        }
    }
}

/// A register document that breaks the record format or an invariant. The
/// message names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The register was written by an unknown format version: a newer one
    /// (written by a newer Chorus, said in one line) or one never written.
    #[error("{}", unsupported_format(found, *supported))]
    UnsupportedFormat {
        /// The format found.
        found: String,
        /// The newest format this build reads (it reads every format from
        /// [`OLDEST_READABLE_FORMAT`](super::OLDEST_READABLE_FORMAT) up to this one).
        supported: u32,
    },
    /// A field is missing, malformed or violates an invariant.
    #[error("invalid register field: field={field}: {reason}")]
    Invalid {
        /// The offending field, e.g. `chorus.segments`.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A field this format does not define.
    #[error("unknown register field: field={field}")]
    UnknownField {
        /// The unknown field name.
        field: String,
    },
}

/// The message of [`ManifestError::UnsupportedFormat`].
fn unsupported_format(found: &str, supported: u32) -> String {
    match NewerFormat::check_text("register", found, supported.into()) {
        Some(newer) => format!("{newer}: field=chorus.format"),
        None => format!(
            "unsupported register format: field=chorus.format value={found:?} supported={}",
            readable_formats_text()
        ),
    }
}

impl ManifestError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> ManifestError {
        ManifestError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    /// The field the error is about.
    pub fn field(&self) -> &str {
        match self {
            ManifestError::UnsupportedFormat { .. } => "chorus.format",
            ManifestError::Invalid { field, .. } => field,
            ManifestError::UnknownField { field } => field,
        }
    }
}
