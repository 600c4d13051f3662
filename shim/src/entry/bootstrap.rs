//! containerd 2.3's shim bootstrap protocol (`containerd.runtime.bootstrap.v1`): at `start`,
//! containerd writes `BootstrapParams` to the shim's stdin and reads a `BootstrapResult`
//! from its stdout. Older containerds write the runtime options (an `Any`) or nothing, and
//! read the address as text or JSON; they still pass everything as flags, which 2.3 does
//! too, so the flags stay what the shim goes by and the params add the socket directory and
//! the runtime options.
//!
//! The two messages are small, so they are read and written field by field rather than
//! generated from containerd's proto.

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{CodedInputStream, CodedOutputStream};

/// What crius's shim reads of containerd's `BootstrapParams`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BootstrapParams {
    pub instance_id: String,
    pub namespace: String,
    pub containerd_version: String,
    /// Extensions: the runtime options among them.
    pub extensions: Vec<Any>,
    /// Where containerd wants the shim's socket (`socket_dir`), if it says.
    pub socket_dir: Option<String>,
}

const INSTANCE_ID: u32 = 1;
const NAMESPACE: u32 = 2;
const CONTAINERD_VERSION: u32 = 4;
const EXTENSIONS: u32 = 8;
const SOCKET_DIR: u32 = 9;
/// `Extension.value`.
const EXTENSION_VALUE: u32 = 1;

impl BootstrapParams {
    /// The params in `input` when it holds containerd 2.3's message for this instance
    /// (`id`, from the `-id` flag); None for what older containerds write (runtime options
    /// in an `Any`, or nothing), which could parse as a message but never names the id.
    pub fn parse(input: &[u8], id: &str) -> Option<Self> {
        if input.is_empty() {
            return None;
        }
        let params = Self::decode(input).ok()?;
        (params.instance_id == id).then_some(params)
    }

    fn decode(input: &[u8]) -> containerd_shim_protos::protobuf::Result<Self> {
        let mut params = Self::default();
        let mut is = CodedInputStream::from_bytes(input);
        while let Some(tag) = is.read_raw_tag_or_eof()? {
            match tag >> 3 {
                INSTANCE_ID if tag & 7 == 2 => params.instance_id = is.read_string()?,
                NAMESPACE if tag & 7 == 2 => params.namespace = is.read_string()?,
                CONTAINERD_VERSION if tag & 7 == 2 => {
                    params.containerd_version = is.read_string()?;
                }
                EXTENSIONS if tag & 7 == 2 => {
                    let bytes = is.read_bytes()?;
                    if let Some(any) = extension_value(&bytes)? {
                        params.extensions.push(any);
                    }
                }
                SOCKET_DIR if tag & 7 == 2 => params.socket_dir = Some(is.read_string()?),
                _ => containerd_shim_protos::protobuf::rt::skip_field_for_tag(tag, &mut is)?,
            }
        }
        Ok(params)
    }

    /// The extension whose type URL ends with `type_name`.
    pub fn extension(&self, type_name: &str) -> Option<&Any> {
        self.extensions
            .iter()
            .find(|any| any.type_url.ends_with(type_name))
    }
}

/// The `Any` of one `Extension` message.
fn extension_value(bytes: &[u8]) -> containerd_shim_protos::protobuf::Result<Option<Any>> {
    let mut is = CodedInputStream::from_bytes(bytes);
    let mut value = None;
    while let Some(tag) = is.read_raw_tag_or_eof()? {
        if tag >> 3 == EXTENSION_VALUE && tag & 7 == 2 {
            value = Some(is.read_message::<Any>()?);
        } else {
            containerd_shim_protos::protobuf::rt::skip_field_for_tag(tag, &mut is)?;
        }
    }
    Ok(value)
}

/// containerd's `BootstrapResult`: the task API version, the address and its protocol.
pub fn encode_result(version: i32, address: &str, protocol: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut os = CodedOutputStream::vec(&mut out);
    // Writing into a Vec cannot fail.
    let _ = os.write_int32(1, version);
    let _ = os.write_string(2, address);
    let _ = os.write_string(3, protocol);
    let _ = os.flush();
    drop(os);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::Message;

    /// An `Any` as the bytes containerd 2.1 and older write to stdin (runtime options).
    fn any_bytes(type_url: &str, value: &[u8]) -> Vec<u8> {
        let any = Any {
            type_url: type_url.to_string(),
            value: value.to_vec(),
            ..Default::default()
        };
        any.write_to_bytes().unwrap_or_default()
    }

    /// BootstrapParams as containerd 2.3 marshals it (field numbers from its proto).
    fn params_bytes(id: &str, socket_dir: Option<&str>, options: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut os = CodedOutputStream::vec(&mut out);
        os.write_string(1, id).unwrap();
        os.write_string(2, "k8s.io").unwrap();
        os.write_int32(3, -1).unwrap();
        os.write_string(4, "2.3.4").unwrap();
        os.write_string(5, "/run/containerd/containerd.sock.ttrpc")
            .unwrap();
        os.write_string(6, "/run/containerd/containerd.sock")
            .unwrap();
        os.write_string(7, "/usr/bin/containerd").unwrap();
        if let Some(value) = options {
            let any = any_bytes("containerd.runc.v1.Options", value);
            let mut extension = Vec::new();
            let mut inner = CodedOutputStream::vec(&mut extension);
            inner.write_bytes(1, &any).unwrap();
            inner.flush().unwrap();
            drop(inner);
            os.write_bytes(8, &extension).unwrap();
        }
        if let Some(dir) = socket_dir {
            os.write_string(9, dir).unwrap();
        }
        os.flush().unwrap();
        drop(os);
        out
    }

    #[test]
    fn containerd_2_3_params_are_read() {
        let input = params_bytes("pod1", Some("/run/ctrd/s"), Some(b"\x0a\x03abc"));
        let params = BootstrapParams::parse(&input, "pod1").expect("params");
        assert_eq!(params.namespace, "k8s.io");
        assert_eq!(params.containerd_version, "2.3.4");
        assert_eq!(params.socket_dir.as_deref(), Some("/run/ctrd/s"));
        let options = params
            .extension("containerd.runc.v1.Options")
            .expect("options");
        assert_eq!(options.value, b"\x0a\x03abc");
        let plain = BootstrapParams::parse(&params_bytes("pod1", None, None), "pod1");
        assert_eq!(plain.expect("params").socket_dir, None);
    }

    #[test]
    fn what_older_containerds_write_is_not_taken_for_params() {
        assert_eq!(BootstrapParams::parse(b"", "pod1"), None);
        // containerd 2.1's runtime options: an Any, whose type URL sits where the id would.
        let any = any_bytes("containerd.runc.v1.Options", b"\x0a\x03abc");
        assert_eq!(BootstrapParams::parse(&any, "pod1"), None);
        // Another instance's params are not this one's.
        assert_eq!(
            BootstrapParams::parse(&params_bytes("pod2", None, None), "pod1"),
            None
        );
        assert_eq!(BootstrapParams::parse(b"\xff\xff\xff", "pod1"), None);
    }

    #[test]
    fn the_result_is_containerds_bootstrap_result() {
        let bytes = encode_result(3, "unix:///run/s", "ttrpc");
        let mut is = CodedInputStream::from_bytes(&bytes);
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), Some(1 << 3));
        assert_eq!(is.read_int32().unwrap(), 3);
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), Some(2 << 3 | 2));
        assert_eq!(is.read_string().unwrap(), "unix:///run/s");
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), Some(3 << 3 | 2));
        assert_eq!(is.read_string().unwrap(), "ttrpc");
        assert_eq!(is.read_raw_tag_or_eof().unwrap(), None);
    }
}
