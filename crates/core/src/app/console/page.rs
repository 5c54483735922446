//! The console's web page: `/console/` and its assets under
//! `/console/assets/`, embedded in the binary (no file to deploy, no
//! JavaScript toolchain to run: the script is hand-written vanilla
//! JavaScript, see `docs/CONSOLE.md`).
//!
//! The page reads the API with relative paths (`api/v1/...`), so it works
//! wherever `/console/` is mounted. Every answer here carries a strict
//! Content-Security-Policy (scripts and styles from this origin only, no
//! inline ones, no framing) and `X-Content-Type-Options: nosniff`.

use http::{HeaderValue, Method, Request, Response, StatusCode, header};

/// The page's HTML.
const INDEX: &str = include_str!("assets/index.html");

/// The page's script.
const SCRIPT: &str = include_str!("assets/console.js");

/// The page's style sheet.
const STYLE: &str = include_str!("assets/console.css");

/// The page's policy: its own script, style and API only; no inline script
/// or style, no plugin, no framing, no form posting anywhere.
pub(super) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Where the page lives.
const ROOT: &str = "/console/";

/// What a page path names: its body and content type.
fn asset(path: &str) -> Option<(&'static str, &'static str)> {
    match path {
        ROOT | "/console/index.html" => Some((INDEX, "text/html; charset=utf-8")),
        "/console/assets/console.js" => Some((SCRIPT, "text/javascript; charset=utf-8")),
        "/console/assets/console.css" => Some((STYLE, "text/css; charset=utf-8")),
        _ => None,
    }
}

/// The answer to `request` if its path is the page's (`/console`,
/// `/console/`, `/console/index.html` or under `/console/assets/`);
/// `None` for any other path (the API's).
pub(super) fn respond<B>(request: &Request<B>) -> Option<Response<String>> {
    let path = request.uri().path();
    if path == "/console" {
        // Relative, so the page's relative paths resolve under any prefix
        // it is mounted at.
        let mut answer = answer(StatusCode::PERMANENT_REDIRECT, String::new(), "text/plain");
        answer
            .headers_mut()
            .insert(header::LOCATION, HeaderValue::from_static("console/"));
        return Some(answer);
    }
    let found = asset(path);
    if found.is_none() && !path.starts_with("/console/assets/") {
        return None;
    }
    let method = request.method();
    if method != Method::GET && method != Method::HEAD {
        let mut refused = answer(
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET\n".to_owned(),
            "text/plain; charset=utf-8",
        );
        refused
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Some(refused);
    }
    Some(match found {
        Some((body, content_type)) => answer(StatusCode::OK, body.to_owned(), content_type),
        None => answer(
            StatusCode::NOT_FOUND,
            "not found\n".to_owned(),
            "text/plain; charset=utf-8",
        ),
    })
}

/// How many bytes the page and its assets weigh.
#[cfg(test)]
fn bytes() -> usize {
    INDEX.len() + SCRIPT.len() + STYLE.len()
}

fn answer(status: StatusCode, body: String, content_type: &'static str) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // The assets change with the binary only; a reload asks again (they
    // are small) rather than run an old script against a new API.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Option<Response<String>> {
        respond(&Request::get(path).body(()).expect("a request"))
    }

    #[test]
    fn the_page_and_its_assets_are_served_with_their_type_and_a_strict_policy() {
        for (path, kind) in [
            (ROOT, "text/html"),
            ("/console/index.html", "text/html"),
            ("/console/assets/console.js", "text/javascript"),
            ("/console/assets/console.css", "text/css"),
            ("/console/assets/missing.js", "text/plain"),
        ] {
            let answer = get(path).unwrap_or_else(|| panic!("{path} is the page's"));
            let headers = answer.headers();
            assert!(
                headers[header::CONTENT_TYPE]
                    .to_str()
                    .unwrap()
                    .starts_with(kind)
            );
            let policy = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
            assert!(policy.starts_with("default-src 'self'"), "{policy}");
            assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
            assert!(!policy.contains("unsafe"), "{policy}");
            assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        assert_eq!(get("/console/assets/missing.js").unwrap().status(), 404);
        assert_eq!(get(ROOT).unwrap().status(), 200);
        assert!(get("/console/api/v1/routes").is_none(), "the API's");
        assert!(get("/console/other").is_none());
        let moved = get("/console").expect("a redirect");
        assert_eq!(moved.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(moved.headers()[header::LOCATION], "console/");
        let posted = respond(&Request::post(ROOT).body(()).unwrap()).expect("the page's");
        assert_eq!(posted.status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[test]
    fn the_page_has_no_inline_script_or_style_and_inserts_no_markup() {
        // The CSP would refuse them: the page would break, not be unsafe.
        assert!(!INDEX.contains("<style"));
        assert!(!INDEX.contains("style="));
        assert_eq!(INDEX.matches("<script").count(), 1);
        assert!(INDEX.contains(r#"<script src="assets/console.js" defer></script>"#));
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT.contains(sink), "the script uses {sink}");
        }
        assert!(
            bytes() < 64 * 1024,
            "the page stays small: {} bytes",
            bytes()
        );
    }
}
