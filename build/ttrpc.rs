//! A prost service generator that emits, beside tonic's code for each service, its ttrpc
//! server: a `<service>_ttrpc` module whose `service` function turns any implementation of
//! the tonic server trait into a ttrpc dispatch table. So both transports come from the
//! same proto and the same trait implementation.
//!
//! The generated handlers are thin: decoding, encoding and status mapping live in
//! `crate::server::ttrpc_glue`, so what is generated stays small and readable.

use std::fmt::Write as _;

use prost_build::{Method, Service, ServiceGenerator};

/// tonic's generator, then the ttrpc one, for every service.
pub struct TonicAndTtrpc {
    pub tonic: Box<dyn ServiceGenerator>,
}

impl ServiceGenerator for TonicAndTtrpc {
    fn generate(&mut self, service: Service, buf: &mut String) {
        buf.push_str(&ttrpc_module(&service));
        self.tonic.generate(service, buf);
    }

    fn finalize(&mut self, buf: &mut String) {
        self.tonic.finalize(buf);
    }

    fn finalize_package(&mut self, package: &str, buf: &mut String) {
        self.tonic.finalize_package(package, buf);
    }
}

/// Hands each package's services to the generator named for it; other packages' services
/// get no code.
pub struct ByPackage {
    pub generators: Vec<(&'static str, Box<dyn ServiceGenerator>)>,
}

impl ByPackage {
    fn generator(&mut self, package: &str) -> Option<&mut Box<dyn ServiceGenerator>> {
        self.generators
            .iter_mut()
            .find(|(name, _)| *name == package)
            .map(|(_, generator)| generator)
    }
}

impl ServiceGenerator for ByPackage {
    fn generate(&mut self, service: Service, buf: &mut String) {
        if let Some(generator) = self.generator(&service.package) {
            generator.generate(service, buf);
        }
    }

    fn finalize(&mut self, buf: &mut String) {
        for (_, generator) in &mut self.generators {
            generator.finalize(buf);
        }
    }

    fn finalize_package(&mut self, package: &str, buf: &mut String) {
        if let Some(generator) = self.generator(package) {
            generator.finalize_package(package, buf);
        }
    }
}

/// The path of a method's message type from inside the generated `_ttrpc` module: prost
/// names a message of the same package by its bare name, an extern one by its full path.
fn message_path(rust_type: &str) -> String {
    if rust_type.starts_with("crate::") || rust_type.starts_with("::") {
        rust_type.to_string()
    } else {
        format!("super::{rust_type}")
    }
}

/// `RuntimeService` -> `runtime_service`.
fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn ttrpc_module(service: &Service) -> String {
    let module = snake_case(&service.name);
    let full_name = format!("{}.{}", service.package, service.proto_name);
    let server_trait = format!("super::{module}_server::{}", service.name);
    let mut handlers = String::new();
    let mut registrations = String::new();
    for method in &service.methods {
        assert!(
            !method.client_streaming,
            "{full_name}/{}: ttrpc client streams are not generated",
            method.proto_name
        );
        let handler = handler_name(method);
        if method.server_streaming {
            handlers.push_str(&stream_handler(method, &server_trait));
            let _ = writeln!(
                registrations,
                "        streams.insert({:?}.to_string(), ::std::sync::Arc::new({handler}(server.clone())));",
                method.proto_name
            );
        } else {
            handlers.push_str(&unary_handler(method, &server_trait));
            let _ = writeln!(
                registrations,
                "        methods.insert({:?}.to_string(), Box::new({handler}(server.clone())));",
                method.proto_name
            );
        }
    }
    let mutable = |used: bool| if used { "mut " } else { "" };
    let methods_mut = mutable(service.methods.iter().any(|m| !m.server_streaming));
    let streams_mut = mutable(service.methods.iter().any(|m| m.server_streaming));
    format!(
        r#"
/// The ttrpc server of `{full_name}`, generated from the same proto as its tonic server.
pub mod {module}_ttrpc {{
    use crate::server::ttrpc_glue as glue;
    use {server_trait};

    /// The service name ttrpc clients address.
    pub const NAME: &str = {full_name:?};

    /// The ttrpc dispatch table serving `server`.
    pub fn service<T: {name} + Clone>(server: T) -> ::ttrpc::r#async::Service {{
        let {methods_mut}methods: ::std::collections::HashMap<
            String,
            Box<dyn ::ttrpc::r#async::MethodHandler + Send + Sync>,
        > = ::std::collections::HashMap::new();
        let {streams_mut}streams: ::std::collections::HashMap<
            String,
            ::std::sync::Arc<dyn ::ttrpc::r#async::StreamHandler + Send + Sync>,
        > = ::std::collections::HashMap::new();
{registrations}        ::ttrpc::r#async::Service {{ methods, streams }}
    }}
{handlers}}}
"#,
        name = service.name,
    )
}

fn handler_name(method: &Method) -> String {
    format!("{}Handler", method.proto_name)
}

fn unary_handler(method: &Method, server_trait: &str) -> String {
    format!(
        r#"
    struct {handler}<T>(T);

    #[::async_trait::async_trait]
    impl<T: {server_trait} + Clone> ::ttrpc::r#async::MethodHandler for {handler}<T> {{
        async fn handler(
            &self,
            _ctx: ::ttrpc::r#async::TtrpcContext,
            req: ::ttrpc::Request,
        ) -> ::ttrpc::Result<::ttrpc::Response> {{
            let request = match glue::decode::<{input}>({rpc:?}, &req.payload, req.timeout_nano) {{
                Ok(request) => request,
                Err(status) => return Ok(status),
            }};
            Ok(glue::respond(self.0.{name}(request).await))
        }}
    }}
"#,
        handler = handler_name(method),
        input = message_path(&method.input_type),
        rpc = method.proto_name,
        name = method.name,
    )
}

fn stream_handler(method: &Method, server_trait: &str) -> String {
    format!(
        r#"
    struct {handler}<T>(T);

    #[::async_trait::async_trait]
    impl<T: {server_trait} + Clone> ::ttrpc::r#async::StreamHandler for {handler}<T> {{
        async fn handler(
            &self,
            ctx: ::ttrpc::r#async::TtrpcContext,
            mut inner: ::ttrpc::r#async::StreamInner,
        ) -> ::ttrpc::Result<Option<::ttrpc::Response>> {{
            let payload = inner.recv().await?;
            let request = match glue::decode::<{input}>({rpc:?}, &payload, ctx.timeout_nano) {{
                Ok(request) => request,
                Err(status) => return Ok(Some(status)),
            }};
            glue::send_stream(inner, self.0.{name}(request).await).await
        }}
    }}
"#,
        handler = handler_name(method),
        input = message_path(&method.input_type),
        rpc = method.proto_name,
        name = method.name,
    )
}
