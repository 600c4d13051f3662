//! The shim's errors, and the ttrpc status each becomes (containerd turns the codes back
//! into its own error kinds: NotFound, AlreadyExists, FailedPrecondition).

use containerd_shim_protos::ttrpc::{self, Code};

use crate::runtime::runc::RuncError;

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("{0}: not found")]
    NotFound(String),
    #[error("{0}: already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error(transparent)]
    Runc(#[from] RuncError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

impl ShimError {
    pub fn io(context: String, source: std::io::Error) -> Self {
        Self::Io { context, source }
    }

    fn code(&self) -> Code {
        match self {
            Self::NotFound(_) => Code::NOT_FOUND,
            Self::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Self::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            Self::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Self::Unimplemented(_) => Code::UNIMPLEMENTED,
            Self::Runc(_) | Self::Io { .. } | Self::Internal(_) => Code::UNKNOWN,
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.to_string()))
    }
}
