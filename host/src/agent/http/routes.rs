//! The route table: each route is added with what its caller needs ([`Permission`]), so the
//! router and the rules `auth` checks are made from one list and cannot drift apart: the
//! builder adds no route without its rule, and the route-role test walks
//! [`RuleBook::rules`], so a route's rule is tested the day it is added.

use crate::acl::Permission;
use axum::Router;
use axum::http::Method;
use axum::routing::MethodRouter;

/// One method on one path, and what its caller needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The method. A GET rule covers HEAD unless a HEAD rule of its own is given.
    pub method: Method,
    /// The path as the router has it, with `{name}` for a segment.
    pub path: &'static str,
    /// What the caller needs.
    pub needs: Permission,
}

impl Rule {
    /// Whether `path` is this rule's path, each `{name}` matching one non-empty segment.
    fn matches_path(&self, path: &str) -> bool {
        let mut given = path.split('/');
        let mut pattern = self.path.split('/');
        loop {
            match (pattern.next(), given.next()) {
                (None, None) => return true,
                (Some(p), Some(g)) if p.starts_with('{') => {
                    if g.is_empty() {
                        return false;
                    }
                }
                (Some(p), Some(g)) if p == g => {}
                _ => return false,
            }
        }
    }
}

/// The rules of every route, in the order they were added.
#[derive(Debug, Clone, Default)]
pub struct RuleBook {
    rules: Vec<Rule>,
}

impl RuleBook {
    /// The rule for `method` on `path`, if any route has one.
    pub fn find(&self, method: &Method, path: &str) -> Option<&Rule> {
        let exact = self
            .rules
            .iter()
            .find(|rule| rule.method == *method && rule.matches_path(path));
        exact.or_else(|| {
            (*method == Method::HEAD)
                .then(|| {
                    self.rules
                        .iter()
                        .find(|rule| rule.method == Method::GET && rule.matches_path(path))
                })
                .flatten()
        })
    }

    /// Whether some rule has `path`, for any method (a 405 rather than a 404).
    pub fn knows_path(&self, path: &str) -> bool {
        self.rules.iter().any(|rule| rule.matches_path(path))
    }

    /// Every rule.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }
}

/// A router being built, with the rule of each of its routes.
pub(super) struct Routes<S> {
    router: Router<S>,
    book: RuleBook,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub(super) fn new() -> Routes<S> {
        Routes {
            router: Router::new(),
            book: RuleBook::default(),
        }
    }

    /// Adds `handler` (a method router for `method` alone) at `path`, needing `needs`.
    pub(super) fn at(
        mut self,
        needs: Permission,
        method: Method,
        path: &'static str,
        handler: MethodRouter<S>,
    ) -> Routes<S> {
        self.router = self.router.route(path, handler);
        self.book.rules.push(Rule {
            method,
            path,
            needs,
        });
        self
    }

    /// A rule for a method another route's handler answers (HEAD, by a GET's handler).
    pub(super) fn rule(mut self, needs: Permission, method: Method, path: &'static str) -> Self {
        self.book.rules.push(Rule {
            method,
            path,
            needs,
        });
        self
    }

    pub(super) fn finish(self) -> (Router<S>, RuleBook) {
        (self.router, self.book)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(rules: &[(Method, &'static str)]) -> RuleBook {
        RuleBook {
            rules: rules
                .iter()
                .map(|(method, path)| Rule {
                    method: method.clone(),
                    path,
                    needs: Permission::Read,
                })
                .collect(),
        }
    }

    #[test]
    fn a_segment_matches_one_non_empty_segment() {
        let book = book(&[(Method::GET, "/v1/job/{id}"), (Method::POST, "/v1/jobs")]);
        assert!(book.find(&Method::GET, "/v1/job/web").is_some());
        assert!(book.find(&Method::HEAD, "/v1/job/web").is_some());
        assert!(book.find(&Method::GET, "/v1/job/").is_none());
        assert!(book.find(&Method::GET, "/v1/job/web/extra").is_none());
        assert!(book.find(&Method::GET, "/v1/jobs").is_none());
        assert!(book.find(&Method::DELETE, "/v1/job/web").is_none());
    }
}
