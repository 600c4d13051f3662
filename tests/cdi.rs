//! CDI devices against the real containerd and runc: a fake vendor's device (a null device
//! node, a mount and an environment variable) named in `CDI_devices` or in a `cdi.k8s.io/*`
//! annotation is there inside the container; an unknown device and a broken spec file fail
//! CreateContainer with messages that name them; a spec written after start-up is used.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::Crius;
use common::pod::{container, pod};
use crius::api::v1::CdiDevice;

fn fake_spec(data: &Path) -> String {
    format!(
        r#"cdiVersion: "0.6.0"
kind: "example.com/fake"
containerEdits:
  env: ["FAKE_VENDOR=yes"]
devices:
  - name: null0
    containerEdits:
      env: ["FAKE_DEVICE=null0"]
      deviceNodes:
        - path: /dev/fake-null
          hostPath: /dev/null
          permissions: rw
      mounts:
        - hostPath: {}
          containerPath: /fake/data
          options: [ro]
"#,
        data.display()
    )
}

const PROBE: &str = "echo gone > /dev/fake-null && stat -c %t:%T /dev/fake-null && \
                     cat /fake/data && echo $FAKE_VENDOR $FAKE_DEVICE && \
                     (echo no > /fake/data 2>/dev/null || echo read-only)";
const EXPECTED: &str = "1:3\nfrom the host\nyes null0\nread-only\n";

#[tokio::test]
async fn a_fake_vendor_device_reaches_the_container_by_field_or_annotation() {
    let cdi = tempfile::tempdir().expect("tempdir");
    let data = cdi.path().join("data.txt");
    std::fs::write(&data, "from the host\n").expect("data");
    std::fs::write(cdi.path().join("fake.yaml"), fake_spec(&data)).expect("spec");
    let dirs = vec![cdi.path().to_path_buf()];
    let crius = Crius::start_with(|c| c.cdi.spec_dirs = dirs, &[]).await;
    let mut pod = pod(&crius, "cdi").await;

    let mut by_field = container("field", "busybox:latest", &["sleep", "1000"]);
    by_field.cdi_devices = vec![CdiDevice {
        name: "example.com/fake=null0".into(),
    }];
    let id = pod.run(by_field).await;
    let (out, err, code) = pod.exec(&id, &["sh", "-c", PROBE], 10).await.expect("exec");
    assert_eq!((out.as_str(), code), (EXPECTED, 0), "{err}");

    let mut by_annotation = container("annotation", "busybox:latest", &["sleep", "1000"]);
    by_annotation.annotations = HashMap::from([(
        "cdi.k8s.io/fake".to_string(),
        "example.com/fake=null0".to_string(),
    )]);
    let id = pod.run(by_annotation).await;
    let (out, err, code) = pod.exec(&id, &["sh", "-c", PROBE], 10).await.expect("exec");
    assert_eq!((out.as_str(), code), (EXPECTED, 0), "{err}");
    pod.remove_pod().await;
}

#[tokio::test]
async fn unknown_devices_and_broken_specs_fail_create_by_name_and_specs_reload() {
    let cdi = tempfile::tempdir().expect("tempdir");
    let data = cdi.path().join("data.txt");
    std::fs::write(&data, "from the host\n").expect("data");
    std::fs::write(cdi.path().join("fake.yaml"), fake_spec(&data)).expect("spec");
    std::fs::write(
        cdi.path().join("broken.json"),
        "{\"cdiVersion\": \"0.6.0\", ",
    )
    .expect("spec");
    let dirs = vec![cdi.path().to_path_buf()];
    let crius = Crius::start_with(|c| c.cdi.spec_dirs = dirs, &[]).await;
    let mut pod = pod(&crius, "cdi-bad").await;

    let mut unknown = container("unknown", "busybox:latest", &["true"]);
    unknown.cdi_devices = vec![CdiDevice {
        name: "example.com/fake=gpu7".into(),
    }];
    let err = pod.create(unknown.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("example.com/fake=gpu7"),
        "{}",
        err.message()
    );
    assert!(err.message().contains("broken.json"), "{}", err.message());

    let mut unqualified = container("unqualified", "busybox:latest", &["true"]);
    unqualified.cdi_devices = vec![CdiDevice {
        name: "gpu7".into(),
    }];
    let err = pod.create(unqualified).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    // The broken file does not cost the good device.
    let mut good = container("good", "busybox:latest", &["sleep", "1000"]);
    good.cdi_devices = vec![CdiDevice {
        name: "example.com/fake=null0".into(),
    }];
    let id = pod.run(good).await;
    let (out, _, _) = pod
        .exec(&id, &["sh", "-c", "echo $FAKE_DEVICE"], 10)
        .await
        .expect("exec");
    assert_eq!(out, "null0\n");

    // A driver writes a spec for its new device: the next container gets it.
    std::fs::write(
        cdi.path().join("late.json"),
        r#"{"cdiVersion":"1.0.0","kind":"example.com/fake",
            "devices":[{"name":"gpu7","containerEdits":{"env":["LATE=1"]}}]}"#,
    )
    .expect("spec");
    unknown.command = vec!["sleep".into(), "1000".into()];
    let id = pod.run(unknown).await;
    let (out, _, _) = pod
        .exec(&id, &["sh", "-c", "echo $LATE"], 10)
        .await
        .expect("exec");
    assert_eq!(out, "1\n");
    pod.remove_pod().await;
}
