// Watching what the component itself receives: a resource object (the
// component's session or an exchange) seen through a Proxy whose listed
// methods are replaced; every other property is the resource's own.

/** `resource` with the methods in `methods` replaced: `methods.name(target, ...args)`. */
export function intercepted(resource, methods) {
  return new Proxy(resource, {
    get(target, name) {
      if (Object.hasOwn(methods, name)) return (...args) => methods[name](target, ...args);
      const value = Reflect.get(target, name);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

/** Makes every call `session` (a runtime.js Session) makes into the component see its resource through `intercepted(resource, methods)`. */
export function interceptSession(session, methods) {
  const call = session.call.bind(session);
  session.call = (fn) => call((resource) => fn(intercepted(resource, methods)));
}
